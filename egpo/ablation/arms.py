"""The ablation's arms (each a set of overrides of ``python -m egpo.main``), its arm sets, and what a seed sets."""

from __future__ import annotations

from egpo.entropy_sources import ENTROPY_SOURCES
from egpo.runs.ablation_dir import run_name  # noqa: F401 - egpo.ablation.run_name: an arm and seed's folder

ESTIMATOR = "algorithm.adv_estimator=egpo"
SOURCE = {source: f"algorithm.entropy_source={source}" for source in ENTROPY_SOURCES}
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
GRPO = (ESTIMATOR, "algorithm.egpo_lambda=0", SOURCE["actor"])  # GRPO's advantage exactly, through egpo's estimator
_ESTIMATOR_ARMS = {
    "grpo": GRPO,
    **{f"egpo_{variant}{source}": (ESTIMATOR, *overrides, SOURCE[source])
       for variant, overrides in VARIANTS.items() for source in SOURCE},
    "egpo_rollout_bypass": (ESTIMATOR, SOURCE["rollout"], "algorithm.rollout_correction.bypass_mode=true"),
}
# The entropy methods verl users reach for, each with its source's coefficients (docs/ablation.md, "Entropy methods")
ACTOR = "actor_rollout_ref.actor"
CLIP_HIGHER = (f"{ACTOR}.clip_ratio_high=0.28",)  # DAPO (Yu et al. 2503.14476): eps_low 0.2, eps_high 0.28
KL_COV = (f"{ACTOR}.policy_loss.loss_mode=kl_cov", f"{ACTOR}.policy_loss.kl_cov_ratio=0.002",  # Cui et al.
          f"{ACTOR}.policy_loss.ppo_kl_coef=1")  # 2505.22617, verl's recipe/entropy/7b_kl_cov.sh
CLIP_COV = (f"{ACTOR}.policy_loss.loss_mode=clip_cov", f"{ACTOR}.policy_loss.clip_cov_ratio=0.0002",
            f"{ACTOR}.policy_loss.clip_cov_lb=1.0", f"{ACTOR}.policy_loss.clip_cov_ub=5.0",  # recipe/entropy/
            f"{ACTOR}.clip_ratio_low=1", f"{ACTOR}.clip_ratio_high=1", f"{ACTOR}.clip_ratio_c=10.0")  # 7b_clip_cov.sh
ENTROPY_BONUS = (f"{ACTOR}.entropy_coeff=0.001",)  # verl's former default entropy_coeff
TOP_ENTROPY = ("algorithm.egpo_token_selection=top_entropy",  # Wang et al. 2506.01939: the top 20% by entropy
               "algorithm.egpo_top_entropy_quantile=0.2")
GTPO = ("algorithm.egpo_method=gtpo",)  # Tan et al. 2508.04349, Eqs. 3, 5, 6, the paper's weights (docs/gtpo.md)
GRPO_S = ("algorithm.egpo_method=grpo_s", f"{ACTOR}.policy_loss.loss_mode=grpo_s",  # Eqs. 8-11: its sequence-ratio
          f"{ACTOR}.loss_agg_mode=seq-mean-token-mean")  # loss, averaged over the responses (1/G)
STARE = ("algorithm.egpo_token_reweighting=stare",)  # Luo et al. 2606.19236, the authors' defaults (egpo.advantage.stare)
_METHOD_ARMS = {
    "grpo_cliphigher": (*GRPO, *CLIP_HIGHER),
    "grpo_symclip": (*GRPO, f"{ACTOR}.clip_ratio_low=0.2", f"{ACTOR}.clip_ratio_high=0.2"),  # PPO's symmetric clip
    "grpo_klcov": (*GRPO, *KL_COV),
    "grpo_clipcov": (*GRPO, *CLIP_COV),
    "grpo_entbonus": (*GRPO, *ENTROPY_BONUS),
    "grpo_8020": (*GRPO, *TOP_ENTROPY),
    "grpo_8020_rollout": (ESTIMATOR, "algorithm.egpo_lambda=0", SOURCE["rollout"], *TOP_ENTROPY),
    "grpo_stare": (*GRPO, *STARE),
    "egpo_rollout_cliphigher": (ESTIMATOR, SOURCE["rollout"], *CLIP_HIGHER),
    "grpo_gtpo": (ESTIMATOR, SOURCE["actor"], *GTPO),  # the paper's H: the old policy's, the actor's recompute
    "grpo_s": (ESTIMATOR, SOURCE["actor"], *GRPO_S),
    # what sets GTPO and GRPO-S apart from GRPO, one thing at a time (docs/gtpo.md, "Evidence"): GTPO with one z-score
    # over both signs (not the paper's Eq. 6), GRPO with GRPO-S's 1/G aggregation, GRPO-S's advantage with verl's loss
    "grpo_gtpo_joint": (ESTIMATOR, SOURCE["actor"], *GTPO, "algorithm.gtpo_norm=joint"),
    "grpo_seqmean": (*GRPO, f"{ACTOR}.loss_agg_mode=seq-mean-token-mean"),
    "grpo_s_verlloss": (ESTIMATOR, SOURCE["actor"], GRPO_S[0]),
    "egpo_rollout_8020": (ESTIMATOR, SOURCE["rollout"], *TOP_ENTROPY),
}
ARMS = {f"{arm}{suffix}": (*overrides, *engine)
        for suffix, engine in ENGINES.items() for arm, overrides in {**_ESTIMATOR_ARMS, **_METHOD_ARMS}.items()}
ARM_SETS = {  # names --arms also takes
    "sources": ("grpo", "egpo_actor", "egpo_rollout", "egpo_rollout_bypass", "egpo_surprisal"),
    "estimators": ("grpo", "egpo_rollout", "egpo_token_rollout", "egpo_respspan_rollout"),
    "entropy_methods": ("grpo", "grpo_cliphigher", "grpo_klcov", "grpo_clipcov", "grpo_entbonus", "grpo_8020",
                        "grpo_stare", "egpo_rollout", "egpo_rollout_cliphigher", "grpo_gtpo", "grpo_s"),
    "vllm_sources": ("grpo_vllm", "egpo_actor_vllm", "egpo_rollout_vllm", "egpo_rollout_bypass_vllm",
                     "egpo_surprisal_vllm"),
    "engines": ("egpo_rollout", "egpo_rollout_vllm"),
    "gtpo_causes": ("grpo", "grpo_gtpo", "grpo_gtpo_joint", "grpo_s", "grpo_seqmean", "grpo_s_verlloss"),
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


