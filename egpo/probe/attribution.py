"""Which pairs of samples drive the predicted entropy change (fresh-gradient part).

With S_i the sequence log probs, the update's gradient g = sum_i a_i grad S_i and the surrogate direction
u = sum_j c_j grad S_j, the fresh-gradient part of the prediction is
    u . fresh = -sum_{j,i} c_j K1(j, i) a_i,   K1(j, i) = grad S_j . (P_eff * grad S_i)
(bilinear). Block totals by prompt group need only per-group aggregated gradients U_g = grad sum_{j in g} c_j S_j
and G_h = grad sum_{i in h} a_i S_i: same-prompt = -sum_g U_g . P G_g, cross-prompt = total - same. The full
per-sequence kernel costs one backward per sequence; it is computed only on request.
"""

from __future__ import annotations

import torch

from egpo.probe.step_probe import dot64


def _weighted(p: list[torch.Tensor], g: list[torch.Tensor]) -> list[torch.Tensor]:
    return [pk.double() * gk.double() for pk, gk in zip(p, g, strict=True)]


def block_totals(
    group_u: list[list[torch.Tensor]], group_g: list[list[torch.Tensor]], preconditioner: list[torch.Tensor]
) -> dict[str, float]:
    """same-prompt / cross-prompt / total contributions to u . fresh (group_u[k] and group_g[k]: group k)."""
    if len(group_u) != len(group_g):
        raise ValueError("group_u and group_g must list the same prompt groups")
    pg = [_weighted(preconditioner, g) for g in group_g]
    same = -sum(dot64(u, w) for u, w in zip(group_u, pg, strict=True))
    u_sum = [torch.stack(ts).sum(0) for ts in zip(*[[t.double() for t in u] for u in group_u])]
    pg_sum = [torch.stack(ts).sum(0) for ts in zip(*pg)]
    total = -dot64(u_sum, pg_sum)
    return {"same_prompt": same, "cross_prompt": total - same, "total": total}


def sequence_kernel(per_sequence_grads: list[list[torch.Tensor]], preconditioner: list[torch.Tensor]) -> torch.Tensor:
    """K1(j, i) = grad S_j . (P * grad S_i), ``(N, N)`` float64 (one gradient per sequence: costly)."""
    flat = torch.stack([torch.cat([g.double().flatten() for g in grads]) for grads in per_sequence_grads])
    p = torch.cat([q.double().flatten() for q in preconditioner])
    return (flat * p) @ flat.T


def block_matrix(
    group_u: list[list[torch.Tensor]], group_g: list[list[torch.Tensor]], preconditioner: list[torch.Tensor]
) -> torch.Tensor:
    """M[g, h] = -U_g . (P * G_h): group g's share of u against group h's share of the update, ``(B, B)`` float64."""
    pg = [_weighted(preconditioner, g) for g in group_g]
    return torch.tensor([[-dot64(u, w) for w in pg] for u in group_u], dtype=torch.float64)


def bias_free_estimates(total: float, same: float, off_half: float, groups: int) -> dict[str, float]:
    """The cross-prompt and cross-fit estimates from the all-pairs total, the same-prompt sum and the sum over
    pairs whose groups lie in different halves (u from one half, the update from the other)."""
    return {"cross_prompt": (total - same) * groups / (groups - 1), "cross_fit": 2.0 * off_half}


def fresh_part_variants(blocks: torch.Tensor) -> dict[str, float]:
    """The fresh-gradient prediction under each estimator, from the group block matrix.

    * ``same_batch``: every pair (biased when u is estimated on the samples that form the update: the self
      and same-prompt terms share their noise, and GRPO's group baseline couples same-prompt pairs);
    * ``cross_prompt``: only pairs from different prompts, rescaled by B / (B - 1) to the full sum's size;
    * ``cross_fit``: u from one half of the prompts against the update from the other half, both ways, x2.
    """
    b = blocks.shape[0]
    if blocks.shape != (b, b) or b < 2:
        raise ValueError(f"need a square block matrix over >= 2 prompt groups, got {tuple(blocks.shape)}")
    total = float(blocks.sum())
    same = float(blocks.diagonal().sum())
    half = b // 2
    first, second = slice(0, half), slice(half, b)
    off_half = float(blocks[first, second].sum() + blocks[second, first].sum())
    return {"same_batch": total, "same_prompt": same, **bias_free_estimates(total, same, off_half, b)}
