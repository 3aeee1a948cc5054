"""EGPO advantage: GRPO's outcome advantage plus a clipped entropy bonus, in two granularities and two spans.

    span_i[t] = 1 where the entropy is read: inside <think> ... </think> (egpo_span=cot, the default) or on
                every valid response token (egpo_span=response)
    bound_i   = |A_i| / egpo_alpha

    egpo_granularity=response (the default, EGPO):
        H_i = mean of the finite entropies over span_i
        advantages[i, t] = (A_i + egpo_lambda * clip(H_i, -bound_i, bound_i)) * response_mask[i, t]
    egpo_granularity=token (Cheng et al., arXiv 2506.14758: psi(H_t) = min(alpha_c * H_t, |A_t| / kappa)):
        advantages[i, t] = (A_i + egpo_lambda * clip(H_it, -bound_i, bound_i) * span_i[t]) * response_mask[i, t]
        which is Cheng et al.'s form with alpha_c = egpo_lambda and kappa = egpo_alpha / egpo_lambda
        (entropy is >= 0, so the lower clip never acts); a non-finite H_it gives that token no bonus.

``A_i`` is verl's own ``compute_grpo_outcome_advantage``, called on the per-response scores (the row sums of
``token_level_rewards``, taken with the same reduction verl uses) so the GRPO part is reused, never re-derived,
and ``egpo_lambda = 0`` reproduces GRPO bit for bit in every variant. ``egpo_lambda < egpo_alpha`` bounds every
shift by ``egpo_lambda / egpo_alpha * |A_i| < |A_i|``: the sign of an advantage is never flipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from egpo.advantage.cot import compute_cot_mask
from egpo.errors import EgpoConfigError
from egpo.advantage.variants import (  # noqa: F401 - re-exported: the estimator's names and checks
    GRANULARITIES,
    SPANS,
    validate_egpo_coefficients,
    validate_egpo_variant,
)

__all__ = [
    "GRANULARITIES",
    "SPANS",
    "EgpoDiagnostics",
    "MissingThinkMarkersError",
    "compute_egpo_advantage",
    "egpo_advantage",
    "validate_egpo_coefficients",
    "validate_egpo_variant",
]

QWEN3_THINK_START = 151667
QWEN3_THINK_END = 151668

@dataclass(frozen=True)
class EgpoDiagnostics:
    """What the estimator saw in one batch. Tensors are 0-d, on the batch's device.

    The ``cot``/``think`` figures describe the thinking span whichever span the bonus read (so arms that read
    different spans compare on the same measure); they are nan when the thinking markers are unknown
    (``egpo_span=response`` on a model without them).
    """

    cot_entropy_mean: torch.Tensor  # mean H_i over responses with a (finite) CoT span; nan if none
    bonus_mean: torch.Tensor  # per response, mean clipped bonus over its valid tokens (before egpo_lambda); mean
    applied_bonus_mean: torch.Tensor  # egpo_lambda x bonus_mean: what the bonus added to the advantage, on average
    no_cot_frac: torch.Tensor  # fraction of responses whose CoT span is empty
    clipped_frac: torch.Tensor  # of the bonuses that can be clipped (span entropy and A_i != 0): fraction clipped
    nonfinite_entropy_count: torch.Tensor  # non-finite entropy values inside the span the bonus reads, left out
    cot_tokens_mean: torch.Tensor  # mean CoT span length in tokens
    bonus_active_frac: torch.Tensor  # fraction of responses whose advantage the bonus changed (lambda x bonus != 0)
    equal_reward_group_frac: torch.Tensor  # fraction of groups whose scores are all equal (A_i = 0 for all)
    think_closed_frac: torch.Tensor  # fraction of responses with </think> among their valid tokens
    response_entropy_mean: torch.Tensor  # mean over responses of the mean finite entropy of their valid tokens
    span_entropy_mean: torch.Tensor  # mean over responses of the mean entropy of the span the bonus reads; nan if none

    def as_metrics(self, prefix: str = "egpo/") -> dict[str, float]:
        """The figures as floats; an undefined one (nan: no span, or no thinking markers) is left out."""
        metrics = {f"{prefix}{name}": float(getattr(self, name)) for name in self.__dataclass_fields__}
        return {key: value for key, value in metrics.items() if value == value}


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


def _span_means(entropy: torch.Tensor, span: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: mean of the finite entropies over ``span`` (float64, 0 where none), how many were counted, and
    how many non-finite values inside the span were left out (0-d).

    Fast path: one dot product per row. A non-finite value anywhere in a row (also outside the span, where it
    meets a 0 weight) makes that row's sum non-finite; only those rows take the exact path.
    """
    n_span = span.count_nonzero(dim=1)
    h_sum = torch.einsum("bl,bl->b", entropy, span.to(entropy.dtype)).to(torch.float64)
    n_counted = n_span
    nonfinite = torch.zeros((), dtype=torch.int64, device=entropy.device)
    suspect = ~torch.isfinite(h_sum)
    if bool(suspect.any()):
        rows_entropy, rows_span = entropy[suspect], span[suspect]
        finite = torch.isfinite(rows_entropy)
        counted = rows_span & finite
        h_sum = h_sum.masked_scatter(suspect, torch.where(counted, rows_entropy, 0).sum(1, dtype=torch.float64))
        n_counted = n_span.masked_scatter(suspect, counted.count_nonzero(dim=1))
        nonfinite = (rows_span & ~finite).sum()
    return torch.where(n_counted > 0, h_sum / n_counted.clamp(min=1), 0.0), n_counted, nonfinite


def _mean_where(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return values[keep].mean() if bool(keep.any()) else values.new_tensor(float("nan"))


def compute_egpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    token_level_entropy: torch.Tensor,
    responses: torch.Tensor,
    *,
    egpo_lambda: float,
    egpo_alpha: float,
    cot_start_token_id: int | None,
    cot_end_token_id: int | None,
    granularity: str,
    span: str,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    starts_inside: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, EgpoDiagnostics]:
    """EGPO advantages and returns, both ``(bs, L)`` (returns equal advantages, as in GRPO), and the
    batch's :class:`EgpoDiagnostics`.

    Args:
        token_level_rewards: ``(bs, L)``; the outcome score of a response is its row sum.
        response_mask: ``(bs, L)`` 0/1 valid response tokens.
        index: ``(bs,)`` group ids (``uid``); responses to one prompt share one.
        token_level_entropy: ``(bs, L)`` policy entropy per response position (a constant: no gradient).
        responses: ``(bs, L)`` sampled token ids, used to find the CoT span.
        cot_start_token_id / cot_end_token_id: ``<think>`` / ``</think>``; may be None with ``span="response"``.
        starts_inside: optional ``(bs,)`` bool, the response begins inside ``<think>`` (see ``compute_cot_mask``).
        granularity: ``"response"`` (one bonus per response) or ``"token"`` (one per token, Cheng et al.).
        span: ``"cot"`` (entropy inside the thinking span) or ``"response"`` (every valid response token).
    """
    validate_egpo_coefficients(egpo_lambda, egpo_alpha)
    validate_egpo_variant(granularity, span)
    _check_inputs(token_level_rewards, response_mask, index, token_level_entropy, responses)
    has_markers = cot_start_token_id is not None and cot_end_token_id is not None
    if span == "cot" and not has_markers:
        raise ValueError(
            "egpo_span=cot reads the entropy inside <think> ... </think> and needs cot_start_token_id and "
            "cot_end_token_id; set them, or read every response token with algorithm.egpo_span=response"
        )

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
        entropy = token_level_entropy.detach()
        valid = response_mask.bool()

        cot = compute_cot_mask(responses, response_mask, cot_start_token_id, cot_end_token_id, starts_inside) \
            if has_markers else None
        reads = cot if span == "cot" else valid
        h_span, n_counted, nonfinite_count = _span_means(entropy, reads)
        has_span = n_counted > 0
        bound = adv.abs() / egpo_alpha
        can_clip = adv != 0  # a zero advantage has a zero bound: nothing to clip

        if granularity == "response":
            h = h_span.to(adv.dtype)
            bonus = torch.maximum(torch.minimum(h, bound), -bound)  # 0 where there is no span
            shift = egpo_lambda * bonus
            # Adding an exact zero is a no-op (keeps GRPO's bits, including the sign of zero).
            advantages = torch.where(shift == 0, adv, adv + shift).unsqueeze(-1) * response_mask
            token_bonus_mean = bonus
            clippable = has_span & can_clip
            clipped = clippable & (h.abs() > bound)
            clipped_frac = clipped.sum() / clippable.sum().clamp(min=1)
            active = (bonus != 0) & (egpo_lambda != 0)
        else:
            counted = reads & torch.isfinite(entropy)
            h = torch.where(counted, entropy, 0).to(adv.dtype)
            b = bound.unsqueeze(-1)
            bonus = torch.clamp(h, min=-b, max=b)  # 0 outside the span and on non-finite entropy
            # x + 0 == x bit for bit except x = -0.0; a -0.0 advantage has a zero bound, so it keeps GRPO's value.
            advantages = torch.add(adv.unsqueeze(-1), bonus, alpha=egpo_lambda).mul_(response_mask)
            negative_zero = (adv == 0) & torch.signbit(adv)
            if bool(negative_zero.any()):
                advantages[negative_zero] = adv[negative_zero].unsqueeze(-1) * response_mask[negative_zero]
            token_bonus_mean = bonus.sum(dim=1) / valid.count_nonzero(dim=1).clamp(min=1)
            clippable = n_counted * can_clip
            clipped_frac = ((h.abs() > b).count_nonzero(dim=1) * can_clip).sum() / clippable.sum().clamp(min=1)
            active = (bonus.count_nonzero(dim=1) > 0) & (egpo_lambda != 0)

        bs = adv.shape[0]
        zero = adv.new_zeros(())
        nan = adv.new_tensor(float("nan"))
        _, group = np.unique(np.asarray(index), return_inverse=True)
        group = torch.as_tensor(group.reshape(-1), device=scores.device)
        n_groups = int(group.max()) + 1 if bs else 0
        flat = scores[:, 0].to(torch.float64)
        low = flat.new_full((n_groups,), float("inf")).scatter_reduce(0, group, flat, "amin")
        high = flat.new_full((n_groups,), float("-inf")).scatter_reduce(0, group, flat, "amax")
        if cot is not None:
            h_cot, n_cot_counted, _ = (h_span, n_counted, None) if span == "cot" else _span_means(entropy, cot)
            n_cot = cot.count_nonzero(dim=1)
            closed = ((responses == cot_end_token_id) & valid).any(dim=1)
            cot_figures = dict(
                cot_entropy_mean=_mean_where(h_cot, n_cot_counted > 0).to(adv.dtype),
                no_cot_frac=(n_cot == 0).float().mean() if bs else zero,
                cot_tokens_mean=n_cot.float().mean() if bs else zero,
                think_closed_frac=closed.float().mean() if bs else zero,
            )
        else:
            cot_figures = dict(cot_entropy_mean=nan, no_cot_frac=nan, cot_tokens_mean=nan, think_closed_frac=nan)
        h_response = h_span if span == "response" else _span_means(entropy, valid)[0]
        diagnostics = EgpoDiagnostics(
            **cot_figures,
            bonus_mean=token_bonus_mean.mean() if bs else zero,
            applied_bonus_mean=egpo_lambda * token_bonus_mean.mean() if bs else zero,
            clipped_frac=clipped_frac,
            nonfinite_entropy_count=nonfinite_count,
            bonus_active_frac=active.float().mean() if bs else zero,
            equal_reward_group_frac=(low == high).float().mean() if bs else zero,
            response_entropy_mean=_mean_where(h_response, valid.any(dim=1)).to(adv.dtype),
            span_entropy_mean=_mean_where(h_span, has_span).to(adv.dtype),
        )
    return advantages, advantages, diagnostics


class MissingThinkMarkersError(EgpoConfigError):
    """``egpo_span=cot`` with no ``<think>`` / ``</think>`` ids: the span cannot be found."""


def egpo_advantage(
    algo,
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    token_level_entropy: torch.Tensor,
    responses: torch.Tensor,
    norm_adv_by_std_in_grpo: bool,
    starts_inside: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, EgpoDiagnostics]:
    """:func:`compute_egpo_advantage` with a run's settings (``algo``: :class:`egpo.advantage.config.
    EgpoAlgorithmConfig`), the one way egpo's callers reach it (the trainer's advantage step and verl's registry).
    The thinking span needs both markers: a run that reads it without them is refused, never given a model's ids."""
    markers = algo.cot_start_token_id is not None and algo.cot_end_token_id is not None
    if algo.egpo_span == "cot" and not markers:
        raise MissingThinkMarkersError(
            "algorithm.cot_start_token_id / cot_end_token_id are unset; `python -m egpo.main` fills them from the "
            "tokenizer. Set them explicitly when building the trainer yourself, or read the entropy over every "
            "response token with algorithm.egpo_span=response.")
    return compute_egpo_advantage(
        token_level_rewards=token_level_rewards,
        response_mask=response_mask,
        index=index,
        token_level_entropy=token_level_entropy,
        responses=responses,
        egpo_lambda=algo.egpo_lambda,
        egpo_alpha=algo.egpo_alpha,
        cot_start_token_id=algo.cot_start_token_id if markers else None,
        cot_end_token_id=algo.cot_end_token_id if markers else None,
        granularity=algo.egpo_granularity,
        span=algo.egpo_span,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        starts_inside=starts_inside,
    )
