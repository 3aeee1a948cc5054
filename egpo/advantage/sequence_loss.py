"""GRPO-S's policy loss (Tan et al., arXiv 2508.04349, Eqs. 10-11), registered with verl's policy-loss registry as
``actor_rollout_ref.actor.policy_loss.loss_mode=grpo_s``: PPO's clipped objective on a **sequence-level** ratio, the
arithmetic mean of the response's token ratios ``pi_theta / pi_theta_old`` over its valid tokens (v5's algorithm box
calls the weight "geometric"; the geometric form is the paper's Appendix C alternative, verl's GSPO), with the
response's advantage (GRPO-S's, the same on each of its tokens), averaged over the responses (``1/G``: verl's
``seq-mean-token-mean`` aggregation, which the ``grpo_s`` arm sets).

verl calls a registered loss in its actor, in the worker processes, with the same arguments on verl 0.7.1 and 0.9.1
(old and new log probs, advantages, the response mask, the aggregation mode, the actor's config, the rollout
correction's per-token weights); the registration runs wherever this module is imported (:func:`register`), which
:mod:`egpo.advantage.loss_plugin` arranges in every process of a run.
"""

from __future__ import annotations

from typing import Any

import torch

LOSS_MODE = "grpo_s"
LOG_RATIO_CLAMP = 20.0  # verl's own clamp on log(pi / pi_old) before the exponential


def sequence_ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(batch,): each response's arithmetic mean of its token ratios over its valid tokens (Eq. 10)."""
    mask = response_mask.to(log_prob.dtype)
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    return (ratio * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)


def grpo_s_policy_loss(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                       response_mask: torch.Tensor, loss_agg_mode: str = "seq-mean-token-mean", config=None,
                       rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Eq. 11: ``max(-A_i * rho_i, -A_i * clip(rho_i, 1 - low, 1 + high))`` per response, ``rho_i`` the sequence
    ratio, ``A_i`` the response's advantage (its valid tokens' mean), spread over its valid tokens and aggregated as
    verl aggregates every loss (``loss_agg_mode``; the rollout correction's weights, where given, as their mean over
    the response)."""
    from verl.trainer.ppo.core_algos import agg_loss

    if config is None:
        raise ValueError("the grpo_s policy loss needs the actor's config (its clip ratios), as verl passes it")
    clip = config.clip_ratio
    low = config.clip_ratio_low if config.clip_ratio_low is not None else clip
    high = config.clip_ratio_high if config.clip_ratio_high is not None else clip
    mask = response_mask.to(log_prob.dtype)
    tokens = mask.sum(-1).clamp_min(1.0)
    rho = sequence_ratio(old_log_prob, log_prob, response_mask)
    advantage = (advantages * mask).sum(-1) / tokens
    unclipped, clipped = -advantage * rho, -advantage * torch.clamp(rho, 1 - low, 1 + high)
    per_response = torch.maximum(unclipped, clipped)
    if rollout_is_weights is not None:
        per_response = per_response * ((rollout_is_weights * mask).sum(-1) / tokens)
    loss_mat = per_response[:, None] * mask
    pg_loss = agg_loss(loss_mat=loss_mat, loss_mask=response_mask, loss_agg_mode=loss_agg_mode,
                       **getattr(config, "global_batch_info", None) or {})
    responses = (mask.sum(-1) > 0).to(log_prob.dtype)
    count = responses.sum().clamp_min(1.0)
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    with torch.no_grad():  # the figures, read in one transfer (verl's own losses read theirs one .item() each)
        figures = torch.stack([(torch.gt(clipped, unclipped).to(log_prob.dtype) * responses).sum() / count,
                               (-log_ratio * mask).sum() / mask.sum().clamp_min(1.0),
                               (rho * responses).sum() / count]).tolist()
    return pg_loss, dict(zip(("actor/pg_clipfrac", "actor/ppo_kl", "actor/grpo_s_ratio_mean"), figures))


def register() -> None:
    """``grpo_s`` in verl's policy-loss registry (idempotent)."""
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss

    if POLICY_LOSS_REGISTRY.get(LOSS_MODE) is not grpo_s_policy_loss:
        register_policy_loss(LOSS_MODE)(grpo_s_policy_loss)
