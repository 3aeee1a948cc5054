"""Agreement between the rollout engine's entropy and the actor's recompute (the ablation's key figure)."""

from __future__ import annotations

import torch

PREFIX = "egpo/entropy_rollout_vs_actor/"


def entropy_agreement(rollout_entropy: torch.Tensor, actor_entropy: torch.Tensor, response_mask: torch.Tensor) -> dict:
    """Mean |rollout - actor| and Pearson r over valid response tokens where both values are finite (float64)."""
    if rollout_entropy.shape != actor_entropy.shape:
        raise ValueError(
            f"rollout_entropy has shape {tuple(rollout_entropy.shape)} but the actor's entropy has shape "
            f"{tuple(actor_entropy.shape)}; the rollout must emit one value per response token"
        )
    r, a = rollout_entropy.detach(), actor_entropy.detach()
    valid = response_mask.bool()
    valid &= torch.isfinite(r)
    valid &= torch.isfinite(a)
    r = r[valid].double()  # only the valid tokens are cast
    a = a[valid].double()
    del valid
    n = r.numel()
    metrics = {f"{PREFIX}tokens": float(n)}
    if n == 0:
        return metrics
    diff = torch.sub(r, a).abs_()
    metrics[f"{PREFIX}mean_abs_diff"] = float(diff.mean())
    metrics[f"{PREFIX}max_abs_diff"] = float(diff.max())
    del diff
    r -= r.mean()  # centred in place: the host memory at 1M+ tokens a step is the two float64 copies and one more
    a -= a.mean()
    denom = torch.sqrt(torch.dot(r, r) * torch.dot(a, a))
    if n > 1 and denom > 0:
        metrics[f"{PREFIX}pearson"] = float(torch.dot(r, a) / denom)
    return metrics


def format_step_summary(step: int | None, metrics: dict) -> str:
    """One readable line of a step's ``egpo/`` metrics (verl's console logger prints them among ~100 others)."""
    parts = [f"{key.removeprefix('egpo/')}={value:.4g}" for key, value in sorted(metrics.items()) if key.startswith("egpo/")]
    return f"[egpo] step {step}: " + " ".join(parts)
