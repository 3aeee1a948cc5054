"""Where the kept entropy is spent: the ``egpo`` branch of verl's ``compute_advantage``.

verl's ``RayPPOTrainer.fit`` calls the module-level ``verl.trainer.ppo.ray_trainer.compute_advantage``, looked
up at call time, and that function hands registered estimators no entropy. :func:`install` wraps it once per
process: ``egpo`` is computed here from the batch (entropy chosen by ``algorithm.entropy_source``, responses,
prompts), and with ``algorithm.egpo_token_selection=top_entropy`` the 80/20 rule's mask (``egpo_update_mask``) from
the same entropy; every other estimator goes to verl's function untouched. The wrap is guarded: if verl's shapes
change, start-up fails with the names of what changed.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

from verl import DataProto
from verl.trainer.ppo import ray_trainer as verl_ray_trainer

from egpo.advantage.cot import prompt_ends_inside_think
from egpo.advantage.egpo import egpo_advantage
from egpo.advantage.gtpo import shaped_advantage
from egpo.advantage.variants import ESTIMATOR_NAME
from egpo.advantage.stare import stare_weights
from egpo.advantage.token_selection import top_entropy_mask
from egpo.compat.versions import TESTED_VERL, install_hint
from egpo.compat.verl_shapes import VerlShapeError
from egpo.errors import EntropyError
from egpo.patching import Patch, parameters
from egpo.settings import ENTROPY_ROLLOUTS, LOG_PROBS, EgpoSettings
from egpo.keys import (EGPO_BATCH_BYTES, ROLLOUT_ENTROPY, ROLLOUT_LOG_PROBS, STEP_BATCH_BYTES, STEP_METRICS,
                       TRANSIENT_BATCH_KEYS, UPDATE_MASK)

_EXPECTED_PARAMS = ("data", "adv_estimator", "gamma", "lam", "num_repeat", "norm_adv_by_std_in_grpo", "config")


class MissingEntropyError(EntropyError):
    pass


def _check_verl_shape() -> None:
    params = parameters(COMPUTE_ADVANTAGE.original())
    if params != _EXPECTED_PARAMS:
        raise VerlShapeError(
            f"verl.trainer.ppo.ray_trainer.compute_advantage has parameters {params}, egpo expects {_EXPECTED_PARAMS} "
            f"(verl {' and '.join(TESTED_VERL)}). {install_hint()}"
        )
    if "compute_advantage" not in verl_ray_trainer.RayPPOTrainer.fit.__code__.co_names:
        raise VerlShapeError(
            f"verl's RayPPOTrainer.fit no longer calls the module-level compute_advantage (verl "
            f"{' and '.join(TESTED_VERL)} do), so egpo cannot supply entropy to the estimator. {install_hint()}"
        )


def missing_entropy_message(settings: EgpoSettings) -> str:
    if settings.algo.entropy_source == "rollout":
        return (
            f"algorithm.entropy_source=rollout but the batch has no '{ROLLOUT_ENTROPY}': the rollout did not return "
            "per-token entropy. Use egpo's rollout path (the egpo recipes set "
            "actor_rollout_ref.rollout.agent.agent_loop_manager_class to egpo's entropy agent-loop manager, which "
            f"serves rollout names {', '.join(ENTROPY_ROLLOUTS)}), or use algorithm.entropy_source=actor."
        )
    if settings.reads_surprisal:
        return (
            f"algorithm.entropy_source=surprisal reads -log p of each sampled token from verl's '{ROLLOUT_LOG_PROBS}', "
            "which this batch lacks: the rollout returns its log probs only with "
            f"++{LOG_PROBS}=true (or use algorithm.entropy_source=actor)."
        )
    return (
        "algorithm.entropy_source=actor but the actor's entropy was not kept for the advantage: the step did not run "
        "the old-log-prob recompute through egpo.trainer.EgpoRayPPOTrainer. Run through `python -m egpo.main`."
    )


def source_entropy(batch, settings: EgpoSettings):
    """The per-token entropy ``algorithm.entropy_source`` names, from the batch: the actor's or the rollout engine's
    entropy as kept, or the sampled token's surprisal, the negation of verl's rollout log probs (a new tensor: verl's
    own stays as it is)."""
    values = batch[settings.entropy_key]
    return values.neg() if settings.reads_surprisal else values


_RUN = {"solved_score": 1.0}  # the run's, set once by the trainer (set_solved_score); pass@k's default till then


def set_solved_score(score: float) -> None:
    """The score at which a response counts as correct (``egpo.pass_at_k.solved_score``: pass@k's and GTPO's and
    GRPO-S's one definition), for this process's advantage steps."""
    _RUN["solved_score"] = float(score)


def compute_egpo_advantage_step(data: DataProto, config, norm_adv_by_std_in_grpo: bool = True) -> DataProto:
    """EGPO advantages into ``data``; its entropy keys are dropped, its diagnostics go to ``meta_info``. ``config``:
    the run's ``algorithm`` node, whose settings the trainer read (:meth:`EgpoSettings.of`)."""
    settings = EgpoSettings.of(config)
    batch = data.batch
    if settings.entropy_key not in batch.keys():
        raise MissingEntropyError(missing_entropy_message(settings))
    if "response_mask" not in batch.keys():
        batch["response_mask"] = verl_ray_trainer.compute_response_mask(data)
    algo = settings.algo
    responses = batch["responses"]
    entropy = source_entropy(batch, settings)
    if entropy.shape != responses.shape:
        raise MissingEntropyError(
            f"batch['{settings.entropy_key}'] has shape {tuple(entropy.shape)} but responses has shape "
            f"{tuple(responses.shape)}: entropy must be aligned 1:1 with the response tokens"
        )
    starts_inside = None
    if algo.cot_start_token_id is not None and algo.cot_end_token_id is not None and "prompts" in batch.keys():
        starts_inside = prompt_ends_inside_think(batch["prompts"], algo.cot_start_token_id, algo.cot_end_token_id)
    shaped = None
    if algo.egpo_method != "egpo":  # GTPO or GRPO-S: EGPO's entropy figures are still logged, for every arm alike
        shaped = shaped_advantage(algo, token_level_rewards=batch["token_level_rewards"],
                                  response_mask=batch["response_mask"], index=data.non_tensor_batch["uid"],
                                  entropy=entropy, solved_score=_RUN["solved_score"],
                                  norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    advantages, returns, diagnostics = egpo_advantage(
        algo if shaped is None else replace(algo, egpo_method="egpo", egpo_lambda=0.0),
        token_level_rewards=batch["token_level_rewards"],
        response_mask=batch["response_mask"],
        index=data.non_tensor_batch["uid"],
        token_level_entropy=entropy,
        responses=responses,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        starts_inside=starts_inside,
    )
    if shaped is not None:
        advantages = returns = shaped.advantages.to(batch["token_level_rewards"].dtype)
    reweighted = None
    if algo.egpo_token_reweighting == "stare":  # STARE: the top-surprisal tokens' advantages, while entropy is low
        if "old_log_probs" not in batch.keys():
            raise MissingEntropyError("algorithm.egpo_token_reweighting=stare reads each token's surprisal from "
                                      "batch['old_log_probs'], which this batch lacks; run through `python -m "
                                      "egpo.main` (verl's recompute, or bypass mode's rollout log probs, fills it)")
        reweighted = stare_weights(advantages, batch["old_log_probs"], entropy, batch["response_mask"],
                                   variant=algo.stare_variant, top_ratio=algo.stare_top_ratio, w=algo.stare_w,
                                   m=algo.stare_m, target_entropy=algo.stare_target_entropy)
        advantages = returns = advantages * reweighted.weights
    batch["advantages"] = advantages
    batch["returns"] = returns
    selection = None
    if settings.selects_tokens:  # the 80/20 rule: the mask the actor update trains on, from the same entropy
        selection = top_entropy_mask(entropy, batch["response_mask"], algo.egpo_top_entropy_quantile,
                                     per_response=settings.selects_per_response)
        batch[UPDATE_MASK] = selection.mask
    held = batch_bytes(batch)  # at its fullest: egpo's keys still in it (sizes only, no copy and no sync)
    for key in TRANSIENT_BATCH_KEYS:
        if key in batch.keys():
            batch.pop(key)
    metrics = diagnostics.as_metrics()  # an undefined figure (no span, no markers) is left out
    metrics.update(held)
    if selection is not None:
        metrics.update(selection.metrics())
    if reweighted is not None:
        metrics.update(reweighted.metrics())
    if shaped is not None:
        metrics.update(shaped.metrics(f"egpo/{algo.egpo_method}"))
    metrics["egpo/starts_inside_frac"] = float(starts_inside.float().mean()) if starts_inside is not None else 0.0
    metrics.update(variant_metrics(settings))
    add_step_metrics(data, metrics)
    return data


def batch_bytes(batch) -> dict[str, float]:
    """The bytes of the batch's tensors, and of egpo's own keys among them (its entropy, its update mask)."""
    sizes = {key: value.numel() * value.element_size() for key, value in batch.items()}
    return {STEP_BATCH_BYTES: float(sum(sizes.values())),
            EGPO_BATCH_BYTES: float(sum(sizes.get(key, 0) for key in (*TRANSIENT_BATCH_KEYS, UPDATE_MASK)))}


def variant_metrics(settings: EgpoSettings) -> dict[str, float]:
    """Which estimator variant ran, as step metrics (1.0 / 0.0)."""
    return {
        "egpo/entropy_source_is_rollout": float(settings.algo.entropy_source == "rollout"),
        "egpo/entropy_source_is_surprisal": float(settings.algo.entropy_source == "surprisal"),
        "egpo/granularity_is_token": float(settings.algo.egpo_granularity == "token"),
        "egpo/span_is_response": float(settings.algo.egpo_span == "response"),
    }


def add_step_metrics(data: DataProto, metrics: dict) -> None:
    data.meta_info.setdefault(STEP_METRICS, {}).update(metrics)


def compute_advantage(original, data, adv_estimator, *args, **kwargs):
    """Around verl's ``compute_advantage``: the ``egpo`` branch; other estimators go to verl unchanged."""
    if getattr(adv_estimator, "value", adv_estimator) != ESTIMATOR_NAME:
        return original(data, adv_estimator, *args, **kwargs)
    bound = inspect.signature(original).bind(data, adv_estimator, *args, **kwargs)
    bound.apply_defaults()
    return compute_egpo_advantage_step(data, bound.arguments["config"], bound.arguments["norm_adv_by_std_in_grpo"])


COMPUTE_ADVANTAGE = Patch("verl.trainer.ppo.ray_trainer:compute_advantage", compute_advantage)


def install() -> None:
    """Routes verl's ``compute_advantage`` through :func:`compute_advantage` (guarded, idempotent)."""
    _check_verl_shape()
    COMPUTE_ADVANTAGE.apply()
