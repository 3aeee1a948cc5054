"""The estimator's name, its variants and the checks of its coefficients: what start-up checks read before verl is
imported (the estimator itself, :mod:`egpo.advantage.egpo`, calls verl's GRPO)."""

from __future__ import annotations

from egpo.typos import did_you_mean

# algorithm.adv_estimator: the name egpo registers its estimator under in verl (egpo.advantage.registry)
ESTIMATOR_NAME = "egpo"

# algorithm.egpo_granularity: one bonus per response from the span's mean entropy, or one per token (Cheng et al.)
GRANULARITIES = ("response", "token")
# algorithm.egpo_span: where the entropy is read: the thinking span, or every valid response token
SPANS = ("cot", "response")


def _default(defaults, key: str) -> str:
    """"; the default is X" where the caller gives the declared defaults (egpo.advantage.config), else nothing."""
    return f"; the default is {defaults[key]!r}" if key in defaults else ""


def validate_egpo_coefficients(egpo_lambda: float, egpo_alpha: float, defaults=()) -> None:
    """``egpo_alpha > 0`` and ``0 <= egpo_lambda < egpo_alpha`` (the bonus then never flips A_i's sign).
    ``defaults``: the declared defaults by key, named in the messages."""
    if not egpo_alpha > 0:
        raise ValueError(f"algorithm.egpo_alpha must be > 0 (got {egpo_alpha}){_default(defaults, 'egpo_alpha')}")
    if not 0 <= egpo_lambda < egpo_alpha:
        raise ValueError(
            f"algorithm.egpo_lambda must lie in [0, egpo_alpha) = [0, {egpo_alpha}) so that the entropy bonus "
            f"cannot flip the sign of the GRPO advantage (got {egpo_lambda}){_default(defaults, 'egpo_lambda')}"
        )


def validate_egpo_variant(granularity: str, span: str, defaults=()) -> None:
    """``egpo_granularity`` in :data:`GRANULARITIES`, ``egpo_span`` in :data:`SPANS`."""
    for key, value, allowed in (("egpo_granularity", granularity, GRANULARITIES), ("egpo_span", span, SPANS)):
        if value not in allowed:
            raise ValueError(
                f"algorithm.{key}={value!r} is not one of {', '.join(repr(a) for a in allowed)}"
                f"{did_you_mean(value, allowed)}"
                f"{_default(defaults, key)}; e.g. algorithm.{key}={allowed[-1]}"
            )
