"""What egpo reads from ``algorithm.*``, validated: shared by ``rollout/`` and ``trainer/`` (below both).

Runs in the driver before Ray or any worker starts, and in the workers that need the settings; every error
names the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from egpo.advantage import validate_egpo_coefficients
from egpo.advantage.registry import ESTIMATOR_NAME
from egpo.keys import ENTROPY_KEY_BY_SOURCE

ENTROPY_SOURCES = tuple(ENTROPY_KEY_BY_SOURCE)


class EgpoConfigError(ValueError):
    """A configuration egpo cannot run; the message says what to change."""


def estimator_name(adv_estimator) -> str:
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
            enabled=estimator_name(algorithm.get("adv_estimator")) == ESTIMATOR_NAME,
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
                "forward pass). Use ++algorithm.entropy_source=rollout (free, from the rollout engine) or set "
                "algorithm.rollout_correction.bypass_mode=false."
            )
        return settings
