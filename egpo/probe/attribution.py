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
