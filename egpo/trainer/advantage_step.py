"""Where the kept entropy is spent: the ``egpo`` branch of verl's ``compute_advantage``.

verl's ``RayPPOTrainer.fit`` calls the module-level ``verl.trainer.ppo.ray_trainer.compute_advantage``, looked
up at call time, and that function hands registered estimators no entropy. :func:`install` wraps it once per
process: for ``egpo`` this module takes from the batch what the method reads (the entropy ``algorithm.entropy_source``
names, responses, prompts, verl's old log probs), has :func:`egpo.advantage.method.compose_method` compute it, and
puts its advantages and update mask (``egpo_update_mask``) back, its entropy keys dropped and its metrics in
``meta_info``: batch plumbing only. Every other estimator goes to verl's function untouched. The wrap is guarded: if verl's shapes
change, start-up fails with the names of what changed.
"""

from __future__ import annotations

import inspect
from verl import DataProto
from verl.trainer.ppo import ray_trainer as verl_ray_trainer

from egpo.advantage.method import MethodInputError, compose_method
from egpo.advantage.variants import ESTIMATOR_NAME
from egpo.compat.versions import TESTED_VERL, install_hint
from egpo.compat.verl_shapes import VerlShapeError
from egpo.errors import EntropyError
from egpo.patching import Patch, parameters
from egpo.entropy_sources import DEFAULT_SOURCE, ENTROPY_SOURCES
from egpo.settings import ENTROPY_ROLLOUTS, LOG_PROBS, EgpoSettings
from egpo.keys import (EGPO_BATCH_BYTES, STEP_BATCH_BYTES, STEP_METRICS,
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
    """Why the batch lacks the source's key, and the fix (:mod:`egpo.entropy_sources`)."""
    return settings.source.missing.format(key=settings.entropy_key, engines=", ".join(ENTROPY_ROLLOUTS),
                                          log_probs=LOG_PROBS)


def source_entropy(batch, settings: EgpoSettings):
    """The per-token entropy ``algorithm.entropy_source`` names, from the batch: the actor's or the rollout engine's
    entropy as kept, or the sampled token's surprisal, the negation of verl's rollout log probs (a new tensor: verl's
    own stays as it is)."""
    values = batch[settings.entropy_key]
    return values.neg() if settings.source.negated else values


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
    try:  # verl's recompute, or bypass mode's rollout log probs, fills old_log_probs in egpo's trainer
        method = compose_method(algo, token_level_rewards=batch["token_level_rewards"],
                                response_mask=batch["response_mask"], index=data.non_tensor_batch["uid"],
                                entropy=entropy, responses=responses, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                                prompts=batch["prompts"] if "prompts" in batch.keys() else None,
                                old_log_probs=batch["old_log_probs"] if "old_log_probs" in batch.keys() else None,
                                solved_score=_RUN["solved_score"])
    except MethodInputError as err:
        raise MissingEntropyError(f"{err}: this batch lacks it; run through `python -m egpo.main`") from None
    batch["advantages"] = method.advantages
    batch["returns"] = method.returns
    if method.update_mask is not None:  # the 80/20 rule: the mask the actor update trains on
        batch[UPDATE_MASK] = method.update_mask
    held = batch_bytes(batch)  # at its fullest: egpo's keys still in it (sizes only, no copy and no sync)
    for key in TRANSIENT_BATCH_KEYS:
        if key in batch.keys():
            batch.pop(key)
    metrics = {**method.metrics, **held, **variant_metrics(settings)}
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
        **{f"egpo/entropy_source_is_{name}": float(settings.algo.entropy_source == name)
           for name in ENTROPY_SOURCES if name != DEFAULT_SOURCE},
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
