"""Agreement between a per-token entropy the run has from the rollout (the engine's entropy, or the sampled token's
surprisal) and the actor's recompute of the entropy (the ablation's key figures)."""

from __future__ import annotations

import torch

from egpo.entropy_sources import SOURCES

PREFIX = SOURCES["rollout"].agreement_prefix  # the rollout engine's entropy against the actor's
SURPRISAL_PREFIX = SOURCES["surprisal"].agreement_prefix  # -log p of the sampled token against the actor's entropy


def entropy_agreement(rollout_entropy: torch.Tensor, actor_entropy: torch.Tensor, response_mask: torch.Tensor,
                      prefix: str = PREFIX) -> dict:
    """Mean (rollout - actor), mean and max |rollout - actor| and Pearson r over valid response tokens where both
    values are finite (float64), under ``prefix``."""
    if rollout_entropy.shape != actor_entropy.shape:
        raise ValueError(
            f"the rollout's per-token values have shape {tuple(rollout_entropy.shape)} but the actor's entropy has "
            f"shape {tuple(actor_entropy.shape)}; the rollout must give one value per response token"
        )
    r, a = rollout_entropy.detach(), actor_entropy.detach()
    valid = response_mask.bool()
    valid &= torch.isfinite(r)
    valid &= torch.isfinite(a)
    r = r[valid].double()  # only the valid tokens are cast
    a = a[valid].double()
    del valid
    n = r.numel()
    metrics = {f"{prefix}tokens": float(n)}
    if n == 0:
        return metrics
    diff = torch.sub(r, a)
    metrics[f"{prefix}mean_diff"] = float(diff.mean())
    diff.abs_()
    metrics[f"{prefix}mean_abs_diff"] = float(diff.mean())
    metrics[f"{prefix}max_abs_diff"] = float(diff.max())
    del diff
    r -= r.mean()  # centred in place: the host memory at 1M+ tokens a step is the two float64 copies and one more
    a -= a.mean()
    denom = torch.sqrt(torch.dot(r, r) * torch.dot(a, a))
    if n > 1 and denom > 0:
        metrics[f"{prefix}pearson"] = float(torch.dot(r, a) / denom)
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
