"""The 80/20 rule's loss (``algorithm.egpo_token_selection=top_entropy`` or ``top_entropy_per_response``): what it
needs of the estimator, the loss and the actor, checked before Ray starts."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from egpo.advantage.token_selection import SELECTING
from egpo.preflight.findings import Finding, error
from egpo.settings import EgpoSettings, fix_text


def token_mean_per_micro_batch(config: DictConfig, settings: EgpoSettings, family: str) -> bool:
    """The 80/20 rule narrows the mask of a token-mean loss that verl's actor divides per micro-batch (verl 0.7.1's
    legacy ``DataParallelPPOActor``: its policy losses get no global token count, ``config.global_batch_info``, which
    only its engine workers fill; ``family``: the workers verl builds). At quantile 1 the mask is the full response mask, weighted as GRPO's own loss is."""
    mode = config.actor_rollout_ref.actor.get("loss_agg_mode", "token-mean")
    return (settings.algo.egpo_token_selection in SELECTING and settings.algo.egpo_top_entropy_quantile < 1
            and mode == "token-mean" and family == "legacy")


def check_token_selection(config: DictConfig, run) -> list[Finding]:
    """``algorithm.egpo_token_selection=top_entropy`` narrows the response mask the whole actor loss reads, so it needs
    egpo's estimator (the mask is set from the entropy it keeps), a loss that is the policy gradient alone (verl's
    entropy bonus and KL loss would be aggregated over the kept tokens only) and an actor that takes that loss's token
    mean over the whole mini-batch (:func:`token_mean_per_micro_batch`)."""
    settings = run.settings
    selection = settings.algo.egpo_token_selection
    if selection not in SELECTING:
        return []
    actor = config.actor_rollout_ref.actor
    problems, fix = [], []
    if not settings.enabled:
        problems.append(f"algorithm.adv_estimator=egpo (got {OmegaConf.select(config, 'algorithm.adv_estimator')}; "
                        "egpo_lambda=0 is GRPO's advantage exactly)")
        fix += ["algorithm.adv_estimator=egpo", "algorithm.egpo_lambda=0"]
    if float(actor.get("entropy_coeff", 0) or 0) != 0:
        problems.append(f"actor_rollout_ref.actor.entropy_coeff=0 (got {actor.entropy_coeff}: the entropy bonus would "
                        "be taken over the kept tokens only)")
        fix.append("actor_rollout_ref.actor.entropy_coeff=0")
    if actor.get("use_kl_loss", False):
        problems.append("actor_rollout_ref.actor.use_kl_loss=false (the KL loss would be taken over the kept tokens "
                        "only)")
        fix.append("actor_rollout_ref.actor.use_kl_loss=false")
    if token_mean_per_micro_batch(config, settings, run.family):
        problems.append("trainer.use_legacy_worker_impl=disable (verl 0.7.1's default legacy actor divides the loss of "
                        "each micro-batch by that micro-batch's own kept tokens, so a kept token would weigh 1 / (the "
                        "kept tokens packed with it), not 1 / (the batch's kept tokens) as the rule defines it; verl's "
                        "engine workers take the batch's token mean, as verl 0.9.1's do)")
        fix.append("trainer.use_legacy_worker_impl=disable")
        if run.on_cpu:
            fix.append("++actor_rollout_ref.actor.fsdp_config.strategy=fsdp2")
    if problems:
        fixes = (tuple(fix),)
        scope = "each response's" if selection == "top_entropy_per_response" else "the batch's"
        return [error("80/20", f"algorithm.egpo_token_selection={selection} (the 80/20 rule: the policy gradient over "
                      f"{scope} top-entropy tokens) needs: {'; '.join(problems)}. Fix: {fix_text(fixes)}", fixes)]
    return []
