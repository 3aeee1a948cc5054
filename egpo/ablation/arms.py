"""The ablation's arms (each a set of overrides of ``python -m egpo.main``), its arm sets, and what a seed sets."""

from __future__ import annotations

ESTIMATOR = "algorithm.adv_estimator=egpo"
SOURCE = {"actor": "algorithm.entropy_source=actor", "rollout": "algorithm.entropy_source=rollout"}
VARIANTS = {  # name part -> overrides: EGPO's granularity and span (algorithm.egpo_granularity / egpo_span)
    "": (),
    "token_": ("algorithm.egpo_granularity=token",),
    "respspan_": ("algorithm.egpo_span=response",),
    "token_respspan_": ("algorithm.egpo_granularity=token", "algorithm.egpo_span=response"),
}
ENGINES = {  # name suffix -> overrides: the rollout engine (none: the config's own)
    "": (),
    "_vllm": ("actor_rollout_ref.rollout.name=vllm",),
}
_ESTIMATOR_ARMS = {
    "grpo": (ESTIMATOR, "algorithm.egpo_lambda=0", SOURCE["actor"]),
    **{f"egpo_{variant}{source}": (ESTIMATOR, *overrides, SOURCE[source])
       for variant, overrides in VARIANTS.items() for source in SOURCE},
    "egpo_rollout_bypass": (ESTIMATOR, SOURCE["rollout"], "algorithm.rollout_correction.bypass_mode=true"),
}
ARMS = {f"{arm}{suffix}": (*overrides, *engine)
        for suffix, engine in ENGINES.items() for arm, overrides in _ESTIMATOR_ARMS.items()}
ARM_SETS = {  # names --arms also takes
    "sources": ("grpo", "egpo_actor", "egpo_rollout", "egpo_rollout_bypass"),
    "estimators": ("grpo", "egpo_rollout", "egpo_token_rollout", "egpo_respspan_rollout"),
    "vllm_sources": ("grpo_vllm", "egpo_actor_vllm", "egpo_rollout_vllm", "egpo_rollout_bypass_vllm"),
    "engines": ("egpo_rollout", "egpo_rollout_vllm"),
}
DEFAULT_ARMS = ARM_SETS["sources"]


def expand_arms(names: list[str]) -> list[str]:
    """Arm names, with set names replaced by their arms (first occurrence kept)."""
    arms = [arm for name in names for arm in ARM_SETS.get(name, (name,))]
    return list(dict.fromkeys(arms))


def seed_overrides(seed: int) -> tuple[str, ...]:
    """The run's rollout seed, from which each replica's engine seed is derived as verl derives it
    (:mod:`egpo.compat.seeds`), and the data order."""
    from egpo.compat.seeds import run_seed_overrides

    return (*run_seed_overrides(seed), f"++data.seed={seed}")


def run_name(arm: str, seed: int) -> str:
    return f"{arm}__seed{seed}"
