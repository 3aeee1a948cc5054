"""GTPO and GRPO-S (Tan et al., "GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with Policy Entropy", arXiv
2508.04349; equations numbered as in its v6 and ICML 2026 text): the outcome reward shaped by each token's (GTPO) or
each response's (GRPO-S) entropy share among the responses of the same outcome, then normalised.

Notation: a group is the responses to one prompt (verl's ``uid``); a response is **correct** when its outcome score
(its token-level rewards summed, as verl's validation and egpo's pass@k read it) is at least the run's solved score
(``egpo.pass_at_k.solved_score``, one definition for the whole project); ``H[i, t]`` is the entropy of token ``t`` of
response ``i`` (``algorithm.entropy_source``'s), and a response "still generating at t" is one whose token ``t`` is
valid (``response_mask``).

GTPO (token level):

* Eq. 3, a correct response's token: ``r+[i,t] = a1 + a2 * H[i,t] / sum_k H[k,t] * d_t``, the sum over the group's
  correct responses still generating at ``t``, ``d_t`` their count.
* Eq. 5, a failed response's token: ``r-[j,t] = -a1 - a2 * (1/H[j,t]) / sum_k (1/H[k,t]) * h_t``, over the group's
  failed responses still generating at ``t``, ``h_t`` their count.
* Eq. 6: the correct responses' token rewards z-scored over all of them, the failed ones' over all of theirs
  (``per_sign``, the paper's); ``joint``: one z-score over both (not the paper's: see docs/gtpo.md).

GRPO-S (sequence level):

* Eq. 8: ``Hhat[k]``, response ``k``'s mean token entropy.
* Eq. 9: correct ``rhat+[i] = b1 + b2 * Hhat[i] / sum_C Hhat * n``; failed ``rhat-[j] = -b1 - b2 * (1/Hhat[j]) /
  sum_F (1/Hhat) * m`` (``n``, ``m``: the group's correct and failed counts).
* The advantage: one z-score over the group's shaped rewards (GRPO's Eq. 1, verl's ``norm_adv_by_std_in_grpo``
  respected), broadcast over the response's tokens. Its loss: :mod:`egpo.advantage.sequence_loss`.

Choices where the paper is silent or ambiguous (docs/gtpo.md says why): the shares are per group (the equations), the
z-scores of Eq. 6 pool the whole batch (the sentence both versions share); a division gets :data:`SHAPING_EPS`
(Remark 2.1): a share over a zero sum is 0, a failed token of zero entropy weighs ``1 / SHAPING_EPS``; a token whose
entropy is not finite takes no part in any share or count and gets its base reward (``+-a1``), counted in the
metrics; a group with no correct (or no failed) response has one branch only.

Vectorised over the batch: the per-group sums are one ``index_add_`` each, no loop over groups, rows or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

SHAPING_EPS = 1e-6  # Remark 2.1's epsilon, where a share's division needs one
ZSCORE_EPS = 1e-6  # the z-scores' epsilon under the standard deviation (verl's GRPO's default)
METHODS = ("egpo", "gtpo", "grpo_s")
GTPO_NORMS = ("per_sign", "joint")
SHAPING_WEIGHTS = ("gtpo_alpha1", "gtpo_alpha2", "grpo_s_beta1", "grpo_s_beta2")
# EGPO's own keys, which GTPO and GRPO-S do not read: refused at another value than their default, never ignored
EGPO_ONLY = ("egpo_granularity", "egpo_span", "egpo_token_reweighting")


def validate_method(algo, defaults: dict) -> None:
    """The method's name, its weights (>= 0), and no EGPO-only setting beside GTPO or GRPO-S (the shaping reads every
    response token's entropy; STARE reweights EGPO's advantages)."""
    from egpo.typos import did_you_mean

    if algo.egpo_method not in METHODS:
        raise ValueError(f"algorithm.egpo_method={algo.egpo_method!r} is not one of "
                         f"{', '.join(repr(m) for m in METHODS)}{did_you_mean(algo.egpo_method, METHODS)}")
    if algo.gtpo_norm not in GTPO_NORMS:
        raise ValueError(f"algorithm.gtpo_norm={algo.gtpo_norm!r} is not one of "
                         f"{', '.join(repr(m) for m in GTPO_NORMS)}{did_you_mean(algo.gtpo_norm, GTPO_NORMS)}")
    for key in SHAPING_WEIGHTS:
        if getattr(algo, key) < 0:
            raise ValueError(f"algorithm.{key} must be >= 0 (got {getattr(algo, key)}); the default is {defaults[key]}")
    if algo.egpo_method != "egpo":
        changed = [f"algorithm.{key}={getattr(algo, key)}" for key in EGPO_ONLY if getattr(algo, key) != defaults[key]]
        if changed:
            raise ValueError(f"algorithm.egpo_method={algo.egpo_method} reads every response token's entropy and "
                             f"has no EGPO bonus to vary or reweight: {', '.join(changed)} would be ignored; leave "
                             f"{'it' if len(changed) == 1 else 'them'} out (the defaults: "
                             + ", ".join(f"{key}={defaults[key]}" for key in EGPO_ONLY) + ")")


@dataclass(frozen=True)
class Shaped:
    advantages: torch.Tensor  # (batch, response length), 0 on padding
    rewards: torch.Tensor  # the shaped rewards: per token (GTPO), or per response broadcast over its tokens (GRPO-S)
    correct: torch.Tensor  # (batch,) bool
    nonfinite: int  # valid tokens whose entropy was not finite (base reward, no share)

    def metrics(self, prefix: str) -> dict[str, float]:
        correct = self.correct
        return {f"{prefix}/correct_frac": float(correct.float().mean()) if correct.numel() else 0.0,
                f"{prefix}/nonfinite_entropy_count": float(self.nonfinite)}


def correct_responses(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                      solved_score: float) -> torch.Tensor:
    """(batch,) bool: the response's outcome score (its rewards over its valid tokens) is at least ``solved_score``."""
    return (token_level_rewards * response_mask).sum(-1) >= solved_score


def group_ids(index) -> tuple[torch.Tensor, int]:
    """Each row's group (verl's uid, any hashable) as 0..G-1, and G."""
    _, inverse = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
    ids = torch.as_tensor(inverse.reshape(-1), dtype=torch.long)
    return ids, int(ids.max()) + 1 if ids.numel() else 0


def _group_sum(values: torch.Tensor, groups: torch.Tensor, count: int) -> torch.Tensor:
    """Per group, summed over its rows (any trailing shape), gathered back to each row."""
    sums = torch.zeros((count, *values.shape[1:]), dtype=values.dtype, device=values.device)
    return sums.index_add_(0, groups, values)[groups]


def _zscore(values: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """``values`` z-scored over the cells ``pool`` marks (unbiased standard deviation, as torch.std), 0 elsewhere."""
    n = pool.sum()
    if int(n) == 0:
        return torch.zeros_like(values)
    mean = (values * pool).sum() / n
    centred = (values - mean) * pool
    var = (centred ** 2).sum() / (n - 1) if int(n) > 1 else torch.zeros((), dtype=values.dtype)
    return centred / (var.sqrt() + ZSCORE_EPS)


def gtpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, entropy: torch.Tensor, *,
                   solved_score: float, alpha1: float, alpha2: float, norm: str) -> Shaped:
    """GTPO's token rewards (Eqs. 3, 5) and advantages (Eq. 6, ``norm``: ``per_sign`` or ``joint``)."""
    mask = response_mask.bool()
    correct = correct_responses(token_level_rewards, response_mask, solved_score)
    groups, count = group_ids(index)
    finite = torch.isfinite(entropy) & mask
    h = torch.where(finite, entropy, torch.zeros((), dtype=entropy.dtype))
    pos, neg = finite & correct[:, None], finite & ~correct[:, None]
    pos_f, neg_f = pos.to(h.dtype), neg.to(h.dtype)
    share_pos = h * pos_f * _group_sum(pos_f, groups, count) / (_group_sum(h * pos_f, groups, count) + SHAPING_EPS)
    inverse = neg_f / (h + SHAPING_EPS)
    share_neg = inverse * _group_sum(neg_f, groups, count) / _group_sum(inverse, groups, count).clamp_min(SHAPING_EPS)
    sign = torch.where(correct, 1.0, -1.0).to(h.dtype)[:, None]
    rewards = (sign * alpha1 + alpha2 * (share_pos - share_neg)) * mask
    valid_pos, valid_neg = mask & correct[:, None], mask & ~correct[:, None]
    if norm == "per_sign":
        advantages = _zscore(rewards, valid_pos) + _zscore(rewards, valid_neg)
    else:
        advantages = _zscore(rewards, mask)
    return Shaped(advantages, rewards, correct, int((mask & ~finite).sum()))


def grpo_s_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index, entropy: torch.Tensor, *,
                     solved_score: float, beta1: float, beta2: float, norm_adv_by_std_in_grpo: bool = True) -> Shaped:
    """GRPO-S's sequence rewards (Eqs. 8, 9) and its group z-score, broadcast over each response's valid tokens."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # config.py reads this module without verl

    mask = response_mask.bool()
    correct = correct_responses(token_level_rewards, response_mask, solved_score)
    groups, count = group_ids(index)
    finite = torch.isfinite(entropy) & mask
    h = torch.where(finite, entropy, torch.zeros((), dtype=entropy.dtype))
    tokens = finite.sum(-1)
    has = tokens > 0  # a response with no finite entropy takes no part in the shares (its base reward only)
    mean_h = h.sum(-1) / tokens.clamp_min(1)  # Eq. 8
    pos, neg = (has & correct).to(h.dtype), (has & ~correct).to(h.dtype)
    share_pos = mean_h * pos * _group_sum(pos, groups, count) / (_group_sum(mean_h * pos, groups, count) + SHAPING_EPS)
    inverse = neg / (mean_h + SHAPING_EPS)
    share_neg = inverse * _group_sum(neg, groups, count) / _group_sum(inverse, groups, count).clamp_min(SHAPING_EPS)
    sign = torch.where(correct, 1.0, -1.0).to(h.dtype)
    shaped = (sign * beta1 + beta2 * (share_pos - share_neg))[:, None]  # Eq. 9, one per response
    # GRPO's z-score over each group, verl's own function (as EGPO's GRPO part): it sums a (bs, 1) row back to it
    scores, _ = compute_grpo_outcome_advantage(token_level_rewards=shaped, response_mask=torch.ones_like(shaped),
                                               index=np.asarray(index), epsilon=ZSCORE_EPS,
                                               norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    advantages = scores * mask
    return Shaped(advantages, shaped * mask, correct, int((mask & ~finite).sum()))


def shaped_advantage(algo, *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index,
                     entropy: torch.Tensor, solved_score: float, norm_adv_by_std_in_grpo: bool = True) -> Shaped:
    """``algo.egpo_method``'s advantages (``gtpo`` or ``grpo_s``), with the settings it names."""
    if algo.egpo_method == "gtpo":
        return gtpo_advantage(token_level_rewards, response_mask, index, entropy, solved_score=solved_score,
                              alpha1=algo.gtpo_alpha1, alpha2=algo.gtpo_alpha2, norm=algo.gtpo_norm)
    if algo.egpo_method == "grpo_s":
        return grpo_s_advantage(token_level_rewards, response_mask, index, entropy, solved_score=solved_score,
                                beta1=algo.grpo_s_beta1, beta2=algo.grpo_s_beta2,
                                norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    raise ValueError(f"algorithm.egpo_method={algo.egpo_method!r} shapes no reward: EGPO's advantage is "
                     "egpo.advantage.egpo.egpo_advantage")
