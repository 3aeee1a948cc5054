"""Registers ``egpo`` with verl's advantage-estimator registry.

verl's ``compute_advantage`` hands a registered estimator only rewards, mask, uid and the ``algorithm``
config: no entropy, no responses. The egpo trainer (``egpo.trainer``) routes ``egpo`` around that call
with the entropy it keeps; the registered function exists so that ``adv_estimator=egpo`` run through a
trainer that cannot supply entropy stops with an explanation instead of silently training GRPO, and so that a caller
that hands it the entropy gets the method as the trainer computes it (:mod:`egpo.advantage.method`), or a refusal.
"""

from __future__ import annotations

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from egpo.advantage.config import EgpoAlgorithmConfig
from egpo.advantage.method import compose_method, unhandable
from egpo.advantage.variants import ESTIMATOR_NAME  # noqa: F401 - egpo.advantage.registry.ESTIMATOR_NAME, as callers import it
from egpo.errors import EntropyError


class EntropyNotSuppliedError(EntropyError):
    pass


def egpo_estimator(
    token_level_rewards,
    response_mask,
    index=None,
    config=None,
    token_level_entropy=None,
    responses=None,
    starts_inside=None,
    prompts=None,
    old_log_probs=None,
    solved_score=None,
    **kwargs,
):
    """verl-registry entry point: the method as egpo's trainer computes it (:func:`egpo.advantage.method.
    compose_method`), from ``token_level_entropy`` and ``responses`` (and, where the settings read them, verl's
    ``old_log_probs`` and the run's ``solved_score``), which verl's stock trainer does not hand it; what it cannot be
    handed or hand back (the 80/20 selection's update mask) is refused in one line."""
    if token_level_entropy is None or responses is None:
        raise EntropyNotSuppliedError(
            "algorithm.adv_estimator=egpo needs per-token entropy and the response tokens, which verl's stock "
            "RayPPOTrainer does not pass to registered estimators. Run the job through `python -m egpo.main` "
            "(it uses egpo.trainer.EgpoRayPPOTrainer, which supplies them), or use another estimator."
        )
    if index is None:
        raise ValueError("adv_estimator=egpo needs the batch's `uid` (group index) in non_tensor_batch")
    algo = EgpoAlgorithmConfig.from_node(config)
    why = unhandable(algo, old_log_probs=old_log_probs is not None, solved_score=solved_score is not None,
                     update_mask=False)
    if why:
        raise EntropyNotSuppliedError(f"{why} (verl's registry): run the job through `python -m egpo.main`, whose "
                                      "trainer does")
    method = compose_method(algo, token_level_rewards=token_level_rewards, response_mask=response_mask, index=index,
                            entropy=token_level_entropy, responses=responses,
                            norm_adv_by_std_in_grpo=(config or {}).get("norm_adv_by_std_in_grpo", True),  # verl's
                            prompts=prompts, starts_inside=starts_inside, old_log_probs=old_log_probs,
                            solved_score=solved_score)
    return method.advantages, method.returns


def register() -> None:
    """Idempotent: registering the same function twice is a no-op in verl's registry."""
    if ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR_NAME) is not egpo_estimator:
        register_adv_est(ESTIMATOR_NAME)(egpo_estimator)
