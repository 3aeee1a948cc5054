"""Validation of the ``algorithm.*`` keys egpo adds, and the ``<think>`` token-id lookup.

Everything here runs in the driver before Ray or any worker starts, and every error names the fix.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omegaconf import DictConfig, open_dict

from egpo.advantage import validate_egpo_coefficients
from egpo.advantage.registry import ESTIMATOR_NAME
from egpo.rollout.entropy import EntropyOptions
from egpo.trainer.keys import ENTROPY_KEY_BY_SOURCE

logger = logging.getLogger(__name__)

ENTROPY_SOURCES = tuple(ENTROPY_KEY_BY_SOURCE)
THINK_START_TOKEN = "<think>"
THINK_END_TOKEN = "</think>"


class EgpoConfigError(ValueError):
    """A configuration egpo cannot run; the message says what to change."""


def _estimator_name(adv_estimator) -> str:
    return getattr(adv_estimator, "value", adv_estimator)


@dataclass(frozen=True)
class EgpoSettings:
    enabled: bool  # algorithm.adv_estimator == egpo
    entropy_source: str
    egpo_lambda: float
    egpo_alpha: float
    cot_start_token_id: int | None
    cot_end_token_id: int | None
    bypass_mode: bool

    @property
    def entropy_key(self) -> str:
        return ENTROPY_KEY_BY_SOURCE[self.entropy_source]

    @classmethod
    def from_algorithm(cls, algorithm) -> "EgpoSettings":
        """Reads and validates the algorithm node (the settings egpo needs, independent of a tokenizer)."""
        source = algorithm.get("entropy_source", "actor")
        if source not in ENTROPY_SOURCES:
            raise EgpoConfigError(
                f"algorithm.entropy_source={source!r} is not one of {', '.join(repr(s) for s in ENTROPY_SOURCES)}: "
                "'actor' uses the entropy of the old-log-prob recompute, 'rollout' the entropy the rollout engine "
                "returns while sampling"
            )
        lam = float(algorithm.get("egpo_lambda", 0.4))
        alpha = float(algorithm.get("egpo_alpha", 2.0))
        try:
            validate_egpo_coefficients(lam, alpha)
        except ValueError as err:
            raise EgpoConfigError(str(err)) from None
        ids = {}
        for key in ("cot_start_token_id", "cot_end_token_id"):
            value = algorithm.get(key, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise EgpoConfigError(f"algorithm.{key} must be a token id (int >= 0) or null (got {value!r})")
            ids[key] = value
        if ids["cot_start_token_id"] is not None and ids["cot_start_token_id"] == ids["cot_end_token_id"]:
            raise EgpoConfigError("algorithm.cot_start_token_id and algorithm.cot_end_token_id must differ")
        correction = algorithm.get("rollout_correction", None) or {}
        settings = cls(
            enabled=_estimator_name(algorithm.get("adv_estimator")) == ESTIMATOR_NAME,
            entropy_source=source,
            egpo_lambda=lam,
            egpo_alpha=alpha,
            bypass_mode=bool(correction.get("bypass_mode", False)),
            **ids,
        )
        if settings.enabled and source == "actor" and settings.bypass_mode:
            raise EgpoConfigError(
                "algorithm.entropy_source=actor needs the actor's old-log-prob recompute, which "
                "algorithm.rollout_correction.bypass_mode=true skips (the point of bypass mode is to avoid that "
                "forward pass). Use algorithm.entropy_source=rollout (free, from the rollout engine) or set "
                "algorithm.rollout_correction.bypass_mode=false."
            )
        return settings


def lookup_think_token_ids(tokenizer) -> tuple[int, int]:
    """Ids of ``<think>`` and ``</think>``, each required to be one token of the tokenizer's vocabulary."""
    vocab = tokenizer.get_vocab()
    ids = []
    for token in (THINK_START_TOKEN, THINK_END_TOKEN):
        if token not in vocab:
            raise EgpoConfigError(
                f"the tokenizer ({getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)}) has no {token!r} "
                "token, so EGPO cannot find the chain-of-thought span. Use a thinking model's tokenizer (Qwen3: "
                "151667/151668) or set algorithm.cot_start_token_id and algorithm.cot_end_token_id explicitly."
            )
        ids.append(vocab[token])
    return ids[0], ids[1]


def resolve_think_token_ids(config: DictConfig, tokenizer) -> None:
    """Fills null ``algorithm.cot_*_token_id`` from the tokenizer (only when EGPO is the estimator)."""
    algorithm = config.algorithm
    if _estimator_name(algorithm.get("adv_estimator")) != ESTIMATOR_NAME:
        return
    if algorithm.get("cot_start_token_id") is not None and algorithm.get("cot_end_token_id") is not None:
        return
    start_id, end_id = lookup_think_token_ids(tokenizer)
    with open_dict(algorithm):
        if algorithm.get("cot_start_token_id") is None:
            algorithm.cot_start_token_id = start_id
        if algorithm.get("cot_end_token_id") is None:
            algorithm.cot_end_token_id = end_id


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
            "distributions. For the ablation set actor_rollout_ref.rollout.custom.entropy.temperature_scaled=true "
            "or sample at temperature 1.0."
        )
        logger.warning(message)
        return message
    return None
