"""Whether the rollout's and the actor's entropies describe one distribution (the sampling temperature): a warning
of the pass, so that ``egpo.preflight`` shows it and a run says it before Ray starts."""

from __future__ import annotations

from omegaconf import DictConfig

from egpo.preflight.findings import Finding, warning
from egpo.rollout.entropy import EntropyOptions


def temperature_finding(config: DictConfig, run) -> Finding | None:
    """When a run compares rollout and actor entropy, both must describe the same distribution.

    The actor's entropy is taken on temperature-scaled logits; the rollout's on raw logits unless
    ``actor_rollout_ref.rollout.custom.entropy.temperature_scaled`` is true. They agree only at temperature 1.
    """
    rollout, settings = config.actor_rollout_ref.rollout, run.settings
    temperature = float(rollout.get("temperature", 1.0))
    scaled = EntropyOptions.from_rollout_config(rollout).temperature_scaled
    compares = not settings.bypass_mode  # both entropies exist whenever the actor recomputes
    if settings.enabled and compares and temperature != 1.0 and not scaled:
        return warning("temperature", (
            f"rollout temperature is {temperature}: the rollout entropy is taken on raw logits while the actor's "
            "entropy is taken on temperature-scaled logits, so egpo/entropy_rollout_vs_actor/* compares two different "
            "distributions. For the ablation set ++actor_rollout_ref.rollout.custom.entropy.temperature_scaled=true "
            "or sample at temperature 1.0."))
    return None
