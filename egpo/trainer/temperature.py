"""The trainer's check that the rollout's and the actor's entropies describe one distribution (the sampling
temperature), said once when the trainer starts."""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from egpo.rollout.entropy import EntropyOptions
from egpo.settings import EgpoSettings

logger = logging.getLogger(__name__)


def warn_on_temperature_mismatch(config: DictConfig, settings: EgpoSettings) -> str | None:
    """When a run compares rollout and actor entropy, both must describe the same distribution.

    The actor's entropy is taken on temperature-scaled logits; the rollout's on raw logits unless
    ``actor_rollout_ref.rollout.custom.entropy.temperature_scaled`` is true. They agree only at temperature 1.
    """
    rollout = config.actor_rollout_ref.rollout
    temperature = float(rollout.get("temperature", 1.0))
    scaled = EntropyOptions.from_rollout_config(rollout).temperature_scaled
    compares = not settings.bypass_mode  # both entropies exist whenever the actor recomputes
    if settings.enabled and compares and temperature != 1.0 and not scaled:
        message = (
            f"rollout temperature is {temperature}: the rollout entropy is taken on raw logits while the actor's "
            "entropy is taken on temperature-scaled logits, so egpo/entropy_rollout_vs_actor/* compares two different "
            "distributions. For the ablation set ++actor_rollout_ref.rollout.custom.entropy.temperature_scaled=true "
            "or sample at temperature 1.0."
        )
        logger.warning(message)
        return message
    return None
