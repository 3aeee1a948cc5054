"""An AdamW step, split exactly into the parts that move the parameters.

torch's AdamW (``foreach`` / single-tensor, not amsgrad) does, with t the new step count,
    theta <- theta * (1 - lr * wd)
    m_t = beta1 * m_{t-1} + (1 - beta1) * g ;  v_t = beta2 * v_{t-1} + (1 - beta2) * g^2
    theta <- theta - (lr / bc1) * m_t / (sqrt(v_t) / sqrt(bc2) + eps),   bc_i = 1 - beta_i^t
so theta_{t+1} - theta_t = fresh + momentum + weight_decay with
    fresh        = -(lr / bc1) * (1 - beta1) * g       / denom   (the effective preconditioner P_eff)
    momentum     = -(lr / bc1) * beta1 * m_{t-1}        / denom
    weight_decay = -lr * wd * theta_t
and denom = sqrt(v_t / bc2) + eps uses the *new* second moment.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AdamWStepParts:
    fresh: list[torch.Tensor]
    momentum: list[torch.Tensor]
    weight_decay: list[torch.Tensor]
    preconditioner: list[torch.Tensor]  # P_eff = lr * (1 - beta1) / (bc1 * denom): fresh = -P_eff * g


def adamw_step_parts(
    theta_before: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avg_before: list[torch.Tensor],
    exp_avg_sq_after: list[torch.Tensor],
    step: int,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
) -> AdamWStepParts:
    """The parts of the step that produced ``exp_avg_sq_after`` (step = the new step count, >= 1), in float64."""
    beta1, beta2 = betas
    bc1 = 1 - beta1**step
    bc2 = 1 - beta2**step
    fresh, momentum, decay, precond = [], [], [], []
    for theta, g, m_prev, v in zip(theta_before, grads, exp_avg_before, exp_avg_sq_after, strict=True):
        denom = (v.double() / bc2).sqrt() + eps
        p_eff = lr * (1 - beta1) / (bc1 * denom)
        precond.append(p_eff)
        fresh.append(-p_eff * g.double())
        momentum.append(-(lr / bc1) * beta1 * m_prev.double() / denom)
        decay.append(-lr * weight_decay * theta.double())
    return AdamWStepParts(fresh, momentum, decay, precond)
