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


# the figures of a step's one console line, in this order, under these names (every egpo/ metric is in the run's
# metrics.jsonl and verl's console logger)
STEP_LINE = (("egpo/cot_entropy_mean", "cot_entropy"), ("egpo/bonus_mean", "bonus"),
             ("egpo/applied_bonus_mean", "applied"), ("egpo/clipped_frac", "clipped"),
             ("egpo/bonus_active_frac", "changed"), ("egpo/token_selection/kept_frac", "kept"),
             ("egpo/entropy_rollout_vs_actor/max_abs_diff", "rollout_vs_actor"))


def format_step_summary(step: int | None, metrics: dict) -> str:
    """One short line a step: the CoT entropy, the bonus before and after egpo_lambda, the share clipped and the share
    of advantages it changed, the 80/20 rule's kept share and the rollout-vs-actor entropy agreement, where present."""
    parts = [f"{name}={metrics[key]:.4g}" for key, name in STEP_LINE if key in metrics]
    return f"[egpo] step {step}: " + " ".join(parts)
