"""The 80/20 rule (Wang et al. 2506.01939): the policy-gradient loss over only the batch's highest-entropy tokens.

:func:`top_entropy_mask` narrows a response mask to the valid response tokens whose entropy is among the top
``quantile`` of the whole batch's valid response tokens (one threshold per batch, as Wang et al. define it, not per
response or per micro-batch). The trainer hands verl's actor update that narrowed mask in place of
``response_mask``, so the loss's own aggregation (``loss_agg_mode``) runs over the kept tokens: token-mean divides
by the kept tokens, not by every token with the others' advantages zeroed. verl's engine workers divide by the
mini-batch's kept tokens across ranks; verl 0.7.1's legacy actor would divide by each micro-batch's own, so the
trainer's start-up check refuses that actor for a quantile below 1.

The threshold is an order statistic, never interpolated: with N valid tokens, k = ceil(quantile * N) (the quantile
read as written in decimal, so 0.2 * 10 keeps 2), the threshold is the k-th largest entropy, and every valid token
at or above it is kept (ties at the threshold are all kept, so a batch can keep more than k). ``quantile=1`` keeps
every valid token: the mask returned equals the one given, bit for bit. torch.quantile's linear interpolation
(TRL's ``top_entropy_quantile``) keeps the same tokens or one fewer.

``egpo_token_selection=top_entropy_per_response`` takes the same order statistic within each response instead:
response i keeps its valid tokens at or above the k_i-th largest of its own entropies, k_i = ceil(quantile * N_i), so
every response with a valid token keeps at least one, and a long, uncertain response does not take the batch's share
from a short, confident one.

A valid token whose entropy is not finite (a NaN or inf from a bf16 overflow or a bad engine row) is never kept and is
counted (``egpo/token_selection/nonfinite_tokens``); the quantile is taken over the finite ones, as the estimator
skips such values. A batch with more than :data:`NONFINITE_SHARE_LIMIT` of its valid tokens non-finite stops the run:
that is a broken entropy, not a stray value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import torch

from egpo.typos import did_you_mean

TOKEN_SELECTIONS = ("all", "top_entropy", "top_entropy_per_response")
SELECTING = ("top_entropy", "top_entropy_per_response")  # the selections that narrow the mask
NONFINITE_SHARE_LIMIT = 0.01  # above this share of a batch's valid tokens, non-finite entropy stops the run


def validate_token_selection(selection: str, quantile: float) -> None:
    """``egpo_token_selection`` in :data:`TOKEN_SELECTIONS`, ``0 < egpo_top_entropy_quantile <= 1``."""
    if selection not in TOKEN_SELECTIONS:
        raise ValueError(
            f"algorithm.egpo_token_selection={selection!r} is not one of "
            f"{', '.join(repr(s) for s in TOKEN_SELECTIONS)}{did_you_mean(selection, TOKEN_SELECTIONS)}: 'all' "
            "trains on every response token, 'top_entropy' "
            "only on the batch's highest-entropy tokens (algorithm.egpo_top_entropy_quantile of them), "
            "'top_entropy_per_response' on each response's own highest-entropy tokens (that share of each)"
        )
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 < quantile <= 1:
        raise ValueError(
            f"algorithm.egpo_top_entropy_quantile must lie in (0, 1] (got {quantile!r}): the fraction of the batch's "
            "valid response tokens the policy gradient keeps; Wang et al. keep 0.2"
        )


def kept_count(n_valid: int, quantile: float) -> int:
    """ceil(quantile * n_valid), with the quantile read as its shortest decimal form (0.7 * 10 is 7, not 8)."""
    return math.ceil(Fraction(repr(float(quantile))) * n_valid)


@dataclass(frozen=True)
class TokenSelection:
    mask: torch.Tensor  # the response mask narrowed to the kept tokens, same shape and dtype
    # the entropy at or above which a valid token is kept; None without a valid token, and per response, where each
    # response has its own (their mean: response_threshold_mean)
    threshold: float | None
    n_valid: int
    n_kept: int
    kept_entropy_mean: float | None
    n_nonfinite: int = 0  # valid tokens whose entropy is NaN or inf: never kept
    response_threshold_mean: float | None = None  # per response: the mean of the responses' own thresholds

    def metrics(self) -> dict[str, float]:
        """Step metrics; the threshold and the kept tokens' mean entropy only where the batch had valid tokens."""
        metrics = {"egpo/token_selection/kept_frac": self.n_kept / self.n_valid if self.n_valid else 0.0,
                   "egpo/token_selection/kept_tokens": float(self.n_kept),
                   "egpo/token_selection/nonfinite_tokens": float(self.n_nonfinite)}
        if self.threshold is not None:
            metrics["egpo/token_selection/entropy_threshold"] = self.threshold
        if self.response_threshold_mean is not None:
            metrics["egpo/token_selection/response_threshold_mean"] = self.response_threshold_mean
        if self.kept_entropy_mean is not None:
            metrics["egpo/token_selection/kept_entropy_mean"] = self.kept_entropy_mean
        return metrics


def top_entropy_mask(entropy: torch.Tensor, response_mask: torch.Tensor, quantile: float,
                     per_response: bool = False) -> TokenSelection:
    """``response_mask`` narrowed to the valid tokens whose ``entropy`` is in the batch's top ``quantile`` (or, with
    ``per_response``, in their own response's top ``quantile``).

    ``entropy`` and ``response_mask``: (batch, response_length); a token is valid where the mask is nonzero. Valid
    tokens with a non-finite entropy are never kept; above :data:`NONFINITE_SHARE_LIMIT` of them the batch is refused.
    """
    validate_token_selection("top_entropy", quantile)
    if entropy.shape != response_mask.shape:
        raise ValueError(f"entropy has shape {tuple(entropy.shape)} but response_mask has shape "
                         f"{tuple(response_mask.shape)}; they must be aligned 1:1 with the response tokens")
    valid = response_mask.bool()
    n_valid_all = int(valid.sum())
    finite = valid & torch.isfinite(entropy)
    values = entropy[finite]
    n_valid = values.numel()
    n_nonfinite = n_valid_all - n_valid
    if n_nonfinite > NONFINITE_SHARE_LIMIT * n_valid_all:
        raise ValueError(f"the entropy is NaN or inf on {n_nonfinite} of the batch's {n_valid_all} valid response tokens "
                         f"(more than {NONFINITE_SHARE_LIMIT:.0%}), so the top-entropy tokens are undefined; look for "
                         "the step's NaN or inf in egpo/*entropy* and the rollout's logits")
    if n_valid == 0:
        return TokenSelection(response_mask * finite.to(response_mask.dtype), None, 0, 0, None, n_nonfinite)
    if per_response:
        return _per_response(entropy, response_mask, finite, quantile, n_valid, n_nonfinite)
    k = kept_count(n_valid, quantile)
    threshold = torch.kthvalue(values, n_valid - k + 1).values  # the k-th largest
    keep = finite & (entropy >= threshold)
    kept = entropy[keep]
    return TokenSelection(
        mask=response_mask * keep.to(response_mask.dtype),
        threshold=float(threshold),
        n_valid=n_valid,
        n_kept=kept.numel(),
        kept_entropy_mean=float(kept.double().mean()),
        n_nonfinite=n_nonfinite,
    )


def _per_response(entropy, response_mask, finite, quantile: float, n_valid: int, n_nonfinite: int) -> TokenSelection:
    """Each row's own order statistic, all rows at once: the rows' finite valid entropies sorted from the highest
    (the others last, as -inf), the k_i-th of row i its threshold; a row without a valid token keeps nothing."""
    per_row = finite.sum(dim=1)  # N_i
    q = Fraction(repr(float(quantile)))
    if q.denominator * int(per_row.max()) < 2**62:  # ceil(quantile * N_i) as kept_count, in int64
        k = (per_row * q.numerator + q.denominator - 1) // q.denominator
    else:  # a quantile of many decimal digits: in Python's integers, once per distinct response length
        lengths, inverse = per_row.unique(return_inverse=True)
        k = torch.tensor([kept_count(int(n), quantile) for n in lengths.tolist()], device=per_row.device)[inverse]
    ranked = entropy.masked_fill(~finite, float("-inf")).sort(dim=1, descending=True).values
    thresholds = ranked.gather(1, (k - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
    keep = finite & (entropy >= thresholds.unsqueeze(1))
    kept = entropy[keep]
    rows = per_row > 0
    return TokenSelection(
        mask=response_mask * keep.to(response_mask.dtype),
        threshold=None,
        n_valid=n_valid,
        n_kept=kept.numel(),
        kept_entropy_mean=float(kept.double().mean()),
        n_nonfinite=n_nonfinite,
        response_threshold_mean=float(thresholds[rows].double().mean()),
    )
