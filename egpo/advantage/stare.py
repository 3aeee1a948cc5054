"""STARE (Luo et al., arXiv 2606.19236): the advantages of a batch's highest-surprisal tokens reweighted, while the
batch's entropy is below a target.

From the authors' verl code (github.com/hp-luo/STARE @3ad99d9: ``verl/trainer/ppo/core_algos.py``,
``compute_stare_token_weights`` at line 1070, ``STAREController`` at line 190, and the loss that multiplies each
token's clipped surrogate by the weight at line 1276), with the paper's sections as that code names them:

* partition (Section 4.1): the valid response tokens of responses with ``A_i > 0`` form T+, of ``A_i < 0`` T-;
  within each set the tokens are ranked by surprisal ``s = -log pi(o_t)``, and the top ``stare_top_ratio`` of the
  set (``k = ceil(ratio * |T|)``, at least 1) form L+ and L-;
* weights (Section 4.2): ``w = stare_w`` on L+; variant C2 also ``w = stare_m`` on L-; 1 elsewhere;
* gate (Section 4.3): the weights apply only while the batch's mean token entropy is below ``stare_target_entropy``;
  at or above it every weight is 1 (GRPO's advantage).

The published defaults (the authors' ``run_short_cot_qwen2.5_math_7b_STARE.sh``): variant O1, ratio 0.1, W 1.1,
M 0.9, target 0.3, the adaptive schedule of Section 4.4 off.

What egpo chooses where the code leaves it to its setting:

* **Advantages, not the loss.** The authors multiply each token's clipped surrogate by ``w``; the surrogate (with
  verl's dual clip) is positively homogeneous in the advantage, so ``w * loss(A) == loss(w * A)`` for every
  ``w > 0`` (tested against verl's own policy loss). egpo scales the advantages in its estimator step and leaves
  verl's policy loss unchanged, on either stack and any ``loss_mode``.
* **One partition per batch.** The authors' loss ranks the tokens of each micro-batch by the surprisal of that
  micro-batch's forward pass; the paper's sets are the batch's. egpo ranks the whole batch once, by the surprisal of
  the old log probabilities (``old_log_probs``: the actor's recompute, or the rollout's in bypass mode), which is the
  first micro-batch's forward pass exactly (the weights before any update), so the selection does not depend on
  how the batch is split across ranks and micro-batches.
* **Ties, k and non-finite values.** k is ``ceil(ratio * |T|)`` with the ratio read as its decimal (0.1 of 30 is 3;
  the authors' ``int(n * ratio + 0.999999)`` agrees); every token at or above the k-th largest surprisal is in L
  (ties are all kept, as the 80/20 rule keeps them: the result does not depend on token order); a token whose
  surprisal is not finite is never selected.
* **The gate's entropy** is the run's own (``algorithm.entropy_source``), its mean over the batch's valid tokens
  (the authors' ``loss_agg_mode=token-mean``); non-finite values are left out.
* **No adaptive schedule.** Section 4.4's weights move with each step (a state a resumed run would have to restore);
  the published runs keep them fixed, and so does egpo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from egpo.advantage.token_selection import kept_count
from egpo.typos import did_you_mean

TOKEN_REWEIGHTINGS = ("none", "stare")
STARE_VARIANTS = ("O1", "C2")


def validate_stare(reweighting: str, variant: str, top_ratio: float, w: float, m: float,
                   target_entropy: float) -> None:
    """``egpo_token_reweighting`` in :data:`TOKEN_REWEIGHTINGS` and STARE's settings in range."""
    if reweighting not in TOKEN_REWEIGHTINGS:
        raise ValueError(f"algorithm.egpo_token_reweighting={reweighting!r} is not one of "
                         f"{', '.join(repr(r) for r in TOKEN_REWEIGHTINGS)}"
                         f"{did_you_mean(reweighting, TOKEN_REWEIGHTINGS)}: 'none' keeps the advantages, 'stare' "
                         "reweights the highest-surprisal tokens' (Luo et al. 2606.19236)")
    if variant not in STARE_VARIANTS:
        raise ValueError(f"algorithm.stare_variant={variant!r} is not one of {', '.join(map(repr, STARE_VARIANTS))}"
                         f"{did_you_mean(variant, STARE_VARIANTS)}: "
                         "O1 reweights the positive set's top tokens, C2 also the negative set's")
    numbers = {"stare_top_ratio": top_ratio, "stare_w": w, "stare_m": m, "stare_target_entropy": target_entropy}
    for key, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"algorithm.{key} must be a finite number (got {value!r})")
    if not 0 < top_ratio <= 1:
        raise ValueError(f"algorithm.stare_top_ratio must lie in (0, 1] (got {top_ratio}): the share of each "
                         "advantage-sign set reweighted; the authors' 0.1")
    if not (w > 0 and m > 0):
        raise ValueError(f"algorithm.stare_w and algorithm.stare_m must be > 0 (got {w}, {m}): a weight scales an "
                         "advantage and must keep its sign; the authors' 1.1 and 0.9")


@dataclass(frozen=True)
class StareWeights:
    weights: torch.Tensor  # (batch, response_length), 1 where no reweighting applies
    gate_on: bool
    batch_entropy: float  # the gate's entropy: mean over the finite valid tokens (nan: none)
    n_valid: int
    n_positive: int  # |T+|, |T-|: valid tokens of responses with A > 0, A < 0
    n_negative: int
    n_selected_positive: int  # |L+|, |L-| (selected whether or not the gate is on)
    n_selected_negative: int
    n_nonfinite: int  # valid tokens whose surprisal is not finite: never selected
    mean_weight: float  # over the valid tokens (1 with the gate off)

    def metrics(self, prefix: str = "egpo/stare/") -> dict[str, float]:
        valid = max(self.n_valid, 1)
        found = {"gate_on": float(self.gate_on), "positive_frac": self.n_positive / valid,
                 "negative_frac": self.n_negative / valid, "selected_positive_frac": self.n_selected_positive / valid,
                 "selected_negative_frac": self.n_selected_negative / valid, "nonfinite_tokens": float(self.n_nonfinite)}
        if self.batch_entropy == self.batch_entropy:
            found["batch_entropy"] = self.batch_entropy
        found["mean_weight"] = self.mean_weight
        return {prefix + key: value for key, value in found.items()}


def _top_share(surprisal: torch.Tensor, candidates: torch.Tensor, ratio: float) -> torch.Tensor:
    """The candidates whose surprisal is at or above the k-th largest among them, k = ceil(ratio * n) >= 1."""
    values = surprisal[candidates]
    n = values.numel()
    if n == 0:
        return torch.zeros_like(candidates)
    k = min(n, max(1, kept_count(n, ratio)))
    threshold = torch.kthvalue(values, n - k + 1).values
    return candidates & (surprisal >= threshold)


def stare_weights(advantages: torch.Tensor, old_log_probs: torch.Tensor, entropy: torch.Tensor,
                  response_mask: torch.Tensor, *, variant: str, top_ratio: float, w: float, m: float,
                  target_entropy: float) -> StareWeights:
    """STARE's per-token weights for a batch; see the module's docstring. All inputs ``(batch, response_length)``;
    ``advantages`` carry each response's sign on its tokens (GRPO's, or EGPO's, which never flips it)."""
    for name, t in (("old_log_probs", old_log_probs), ("entropy", entropy), ("response_mask", response_mask)):
        if t.shape != advantages.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but advantages have {tuple(advantages.shape)}; "
                             "STARE's inputs are aligned 1:1 with the response tokens")
    with torch.no_grad():
        valid = response_mask.bool()
        surprisal = -old_log_probs.detach()
        finite = torch.isfinite(surprisal)
        in_positive, in_negative = valid & (advantages > 0), valid & (advantages < 0)  # T+ and T-
        selected_positive = _top_share(surprisal, in_positive & finite, top_ratio)
        selected_negative = (_top_share(surprisal, in_negative & finite, top_ratio) if variant == "C2"
                             else torch.zeros_like(valid))
        counted = valid & torch.isfinite(entropy)
        n_counted = int(counted.sum())
        batch_entropy = (float(torch.where(counted, entropy.detach(), 0).sum(dtype=torch.float64)) / n_counted
                         if n_counted else float("nan"))
        gate_on = n_counted > 0 and batch_entropy < target_entropy
        weights = torch.ones_like(advantages)
        if gate_on:
            weights = weights.masked_fill(selected_positive, w).masked_fill(selected_negative, m)
        n_valid = int(valid.sum())
        mean_weight = float(weights[valid].double().mean()) if n_valid else 1.0
    return StareWeights(
        weights=weights, gate_on=gate_on, batch_entropy=batch_entropy, n_valid=n_valid, mean_weight=mean_weight,
        n_positive=int(in_positive.sum()), n_negative=int(in_negative.sum()),
        n_selected_positive=int(selected_positive.sum()), n_selected_negative=int(selected_negative.sum()),
        n_nonfinite=n_valid - int((valid & finite).sum()))
