"""EGPO advantage: GRPO's outcome advantage plus a clipped bonus from the mean chain-of-thought entropy.

    H_i     = mean of the finite entropies over response i's CoT span
    bound_i = |A_i| / egpo_alpha
    A'_i    = A_i + egpo_lambda * clip(H_i, -bound_i, bound_i)
    advantages[i, t] = A'_i * response_mask[i, t]

``A_i`` is verl's own ``compute_grpo_outcome_advantage``, called on the per-response scores (the row
sums of ``token_level_rewards``, taken with the same reduction verl uses) so the GRPO part is reused,
never re-derived, and ``egpo_lambda = 0`` reproduces GRPO bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from egpo.advantage.cot import compute_cot_mask

__all__ = [
    "EgpoDiagnostics",
    "compute_egpo_outcome_advantage",
    "compute_egpo_advantage_with_diagnostics",
    "validate_egpo_coefficients",
]

QWEN3_THINK_START = 151667
QWEN3_THINK_END = 151668


@dataclass(frozen=True)
class EgpoDiagnostics:
    """What the estimator saw in one batch. Tensors are 0-d, on the batch's device."""

    cot_entropy_mean: torch.Tensor  # mean H_i over responses with a (finite) CoT span; nan if none
    bonus_mean: torch.Tensor  # mean clipped bonus over all responses (before egpo_lambda)
    no_cot_frac: torch.Tensor  # fraction of responses whose CoT span is empty
    clipped_frac: torch.Tensor  # of responses with a span and A_i != 0: fraction whose |H_i| exceeds |A_i| / alpha
    nonfinite_entropy_count: torch.Tensor  # non-finite entropy values inside CoT spans, left out
    cot_tokens_mean: torch.Tensor  # mean CoT span length in tokens
    bonus_active_frac: torch.Tensor  # fraction of responses whose bonus is non-zero
    equal_reward_group_frac: torch.Tensor  # fraction of groups whose scores are all equal (A_i = 0 for all)
    think_closed_frac: torch.Tensor  # fraction of responses with </think> among their valid tokens

    def as_metrics(self, prefix: str = "egpo/") -> dict[str, float]:
        return {
            f"{prefix}cot_entropy_mean": float(self.cot_entropy_mean),
            f"{prefix}bonus_mean": float(self.bonus_mean),
            f"{prefix}no_cot_frac": float(self.no_cot_frac),
            f"{prefix}clipped_frac": float(self.clipped_frac),
            f"{prefix}nonfinite_entropy_count": float(self.nonfinite_entropy_count),
            f"{prefix}cot_tokens_mean": float(self.cot_tokens_mean),
            f"{prefix}bonus_active_frac": float(self.bonus_active_frac),
            f"{prefix}equal_reward_group_frac": float(self.equal_reward_group_frac),
            f"{prefix}think_closed_frac": float(self.think_closed_frac),
        }


def validate_egpo_coefficients(egpo_lambda: float, egpo_alpha: float) -> None:
    """``egpo_alpha > 0`` and ``0 <= egpo_lambda < egpo_alpha`` (the bonus then never flips A_i's sign)."""
    if not egpo_alpha > 0:
        raise ValueError(f"algorithm.egpo_alpha must be > 0 (got {egpo_alpha}); the default is 2.0")
    if not 0 <= egpo_lambda < egpo_alpha:
        raise ValueError(
            f"algorithm.egpo_lambda must lie in [0, egpo_alpha) = [0, {egpo_alpha}) so that the entropy bonus "
            f"cannot flip the sign of the GRPO advantage (got {egpo_lambda}); the default is 0.4"
        )


def _check_inputs(token_level_rewards, response_mask, index, token_level_entropy, responses) -> None:
    shape = responses.shape
    if responses.dim() != 2:
        raise ValueError(f"responses must be 2-D (batch, response_length); got shape {tuple(shape)}")
    for name, t in (
        ("token_level_rewards", token_level_rewards),
        ("response_mask", response_mask),
        ("token_level_entropy", token_level_entropy),
    ):
        if t.shape != shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but responses has shape {tuple(shape)}; every EGPO input "
                "must be aligned 1:1 with the response tokens"
            )
    if len(index) != shape[0]:
        raise ValueError(f"index (uid) has {len(index)} entries but the batch has {shape[0]} responses")


def compute_egpo_advantage_with_diagnostics(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    token_level_entropy: torch.Tensor,
    responses: torch.Tensor,
    egpo_lambda: float = 0.4,
    egpo_alpha: float = 2.0,
    cot_start_token_id: int = QWEN3_THINK_START,
    cot_end_token_id: int = QWEN3_THINK_END,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    starts_inside: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, EgpoDiagnostics]:
    """:func:`compute_egpo_outcome_advantage` plus the batch's :class:`EgpoDiagnostics`."""
    validate_egpo_coefficients(egpo_lambda, egpo_alpha)
    _check_inputs(token_level_rewards, response_mask, index, token_level_entropy, responses)

    with torch.no_grad():
        # GRPO scalar per response, from verl's own function (it sums a (bs, 1) row back to the same score).
        scores = token_level_rewards.sum(dim=-1, keepdim=True)
        grpo, _ = compute_grpo_outcome_advantage(
            token_level_rewards=scores,
            response_mask=torch.ones_like(scores),
            index=index,
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        )
        adv = grpo[:, 0]

        cot = compute_cot_mask(responses, response_mask, cot_start_token_id, cot_end_token_id, starts_inside)
        entropy = token_level_entropy.detach()
        n_cot = cot.sum(dim=1)
        # Fast path: one dot product per row. A non-finite value anywhere in a row (also outside the span,
        # where it meets a 0 weight) makes that row's sum non-finite; only those rows take the exact path.
        h_sum = torch.einsum("bl,bl->b", entropy, cot.to(entropy.dtype)).to(torch.float64)
        n_counted = n_cot
        nonfinite_count = torch.zeros((), dtype=torch.int64, device=entropy.device)
        suspect = ~torch.isfinite(h_sum)
        if bool(suspect.any()):
            rows_entropy, rows_cot = entropy[suspect], cot[suspect]
            finite = torch.isfinite(rows_entropy)
            counted = rows_cot & finite
            h_sum = h_sum.masked_scatter(suspect, torch.where(counted, rows_entropy, 0).sum(1, dtype=torch.float64))
            n_counted = n_cot.masked_scatter(suspect, counted.sum(dim=1))
            nonfinite_count = (rows_cot & ~finite).sum()
        has_span = n_counted > 0
        h_mean = torch.where(has_span, h_sum / n_counted.clamp(min=1), 0.0).to(adv.dtype)

        bound = adv.abs() / egpo_alpha
        bonus = torch.maximum(torch.minimum(h_mean, bound), -bound)  # 0 where there is no span
        shift = egpo_lambda * bonus
        # Adding an exact zero is a no-op (keeps GRPO's bits, including the sign of zero).
        adv_egpo = torch.where(shift == 0, adv, adv + shift)
        advantages = adv_egpo.unsqueeze(-1) * response_mask

        bs = adv.shape[0]
        zero = bonus.new_zeros(())
        can_clip = has_span & (adv != 0)  # a zero advantage has a zero bound: nothing to clip
        _, group = np.unique(np.asarray(index), return_inverse=True)
        group = torch.as_tensor(group.reshape(-1), device=scores.device)
        n_groups = int(group.max()) + 1 if bs else 0
        flat = scores[:, 0].to(torch.float64)
        low = flat.new_full((n_groups,), float("inf")).scatter_reduce(0, group, flat, "amin")
        high = flat.new_full((n_groups,), float("-inf")).scatter_reduce(0, group, flat, "amax")
        closed = ((responses == cot_end_token_id) & response_mask.bool()).any(dim=1)
        diagnostics = EgpoDiagnostics(
            cot_entropy_mean=h_mean[has_span].mean() if bool(has_span.any()) else bonus.new_tensor(float("nan")),
            bonus_mean=bonus.mean() if bs else zero,
            no_cot_frac=(n_cot == 0).float().mean() if bs else zero,
            clipped_frac=(can_clip & (h_mean.abs() > bound)).sum() / can_clip.sum().clamp(min=1),
            nonfinite_entropy_count=nonfinite_count,
            cot_tokens_mean=n_cot.float().mean() if bs else zero,
            bonus_active_frac=(bonus != 0).float().mean() if bs else zero,
            equal_reward_group_frac=(low == high).float().mean() if bs else zero,
            think_closed_frac=closed.float().mean() if bs else zero,
        )
    return advantages, advantages, diagnostics


def compute_egpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    token_level_entropy: torch.Tensor,
    responses: torch.Tensor,
    egpo_lambda: float = 0.4,
    egpo_alpha: float = 2.0,
    cot_start_token_id: int = QWEN3_THINK_START,
    cot_end_token_id: int = QWEN3_THINK_END,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    starts_inside: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EGPO advantages and returns, both ``(bs, L)`` (returns equal advantages, as in GRPO).

    Args:
        token_level_rewards: ``(bs, L)``; the outcome score of a response is its row sum.
        response_mask: ``(bs, L)`` 0/1 valid response tokens.
        index: ``(bs,)`` group ids (``uid``); responses to one prompt share one.
        token_level_entropy: ``(bs, L)`` policy entropy per response position (a constant: no gradient).
        responses: ``(bs, L)`` sampled token ids, used to find the CoT span.
        starts_inside: optional ``(bs,)`` bool, the response begins inside ``<think>`` (see ``compute_cot_mask``).
    """
    advantages, returns, _ = compute_egpo_advantage_with_diagnostics(
        token_level_rewards,
        response_mask,
        index,
        token_level_entropy,
        responses,
        egpo_lambda=egpo_lambda,
        egpo_alpha=egpo_alpha,
        cot_start_token_id=cot_start_token_id,
        cot_end_token_id=cot_end_token_id,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        epsilon=epsilon,
        starts_inside=starts_inside,
    )
    return advantages, returns
