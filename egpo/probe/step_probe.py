"""delta_H_pred = u . (theta_{t+1} - theta_t), taken around a real AdamW step, reduced in float64.

:class:`AdamWStepProbe` registers step pre/post hooks on the optimizer: before the step (after any gradient
clipping) it keeps theta_t and the first moment m_{t-1}; after it, it reads theta_{t+1}, the new second
moment and the clipped gradient, so the prediction includes clipping, momentum, bias correction, weight
decay and the learning-rate schedule with no model of Adam. The step's three parts
(:mod:`egpo.probe.adamw`) give the prediction's split. Under sharding (FSDP) each rank holds its shard: the
dot products here are local and the caller all-reduces them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from egpo.probe.adamw import AdamWStepParts, adamw_step_parts


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (FSDP2), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def dot64_local(a: list[torch.Tensor], b: list[torch.Tensor]) -> torch.Tensor:
    """sum_k <a_k, b_k> over this rank's shards, a float64 scalar tensor on the CPU (not yet all-reduced)."""
    total = torch.zeros((), dtype=torch.float64)
    for x, y in zip(a, b, strict=True):
        total += (local(x).detach().double() * local(y).detach().double()).sum().cpu()
    return total


def dot64(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """sum_k <a_k, b_k> in float64 (one process)."""
    return float(dot64_local(a, b))


@dataclass
class StepRecord:
    params: list[torch.nn.Parameter]
    delta: list[torch.Tensor]  # theta_{t+1} - theta_t, float64
    parts: AdamWStepParts

    def dots_local(self, u: list[torch.Tensor]) -> torch.Tensor:
        """u . (delta, fresh, momentum, weight_decay) over this rank's shards, float64 ``(4,)`` (not all-reduced)."""
        return torch.stack([
            dot64_local(u, self.delta),
            dot64_local(u, self.parts.fresh),
            dot64_local(u, self.parts.momentum),
            dot64_local(u, self.parts.weight_decay),
        ])


@dataclass
class DeltaHPrediction:
    total: float  # u . (theta_{t+1} - theta_t)
    fresh: float  # u . (fresh-gradient part)
    momentum: float
    weight_decay: float

    def as_metrics(self, prefix: str = "probe/") -> dict[str, float]:
        return {
            f"{prefix}delta_h_pred": self.total,
            f"{prefix}delta_h_pred_fresh": self.fresh,
            f"{prefix}delta_h_pred_momentum": self.momentum,
            f"{prefix}delta_h_pred_weight_decay": self.weight_decay,
        }


class AdamWStepProbe:
    def __init__(self, optimizer: torch.optim.Optimizer):
        if not isinstance(optimizer, torch.optim.AdamW):
            raise TypeError(f"the probe decomposes torch.optim.AdamW steps; got {type(optimizer).__name__}")
        for group in optimizer.param_groups:
            if group.get("amsgrad") or group.get("maximize") or group.get("capturable"):
                raise ValueError("the probe supports AdamW without amsgrad / maximize / capturable")
        self.optimizer = optimizer
        self.active = True  # capture steps (cloning parameters and state) only while active
        self.on_step: list = []  # callbacks(record) after each captured step
        self.last: StepRecord | None = None
        self._before: list[tuple] = []
        self._handles = [
            optimizer.register_step_pre_hook(self._pre_step),
            optimizer.register_step_post_hook(self._post_step),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def _stepped_params(self):
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    yield group, p

    def _pre_step(self, optimizer, args, kwargs):
        self._before = []
        if not self.active:
            return
        for group, p in self._stepped_params():
            state = optimizer.state.get(p, {})
            m_prev = local(state["exp_avg"]).detach().clone() if "exp_avg" in state else torch.zeros_like(local(p))
            self._before.append((group, p, local(p).detach().clone(), m_prev))

    def _post_step(self, optimizer, args, kwargs):
        if not self._before:
            return
        params, delta = [], []
        by_group: dict[int, list] = {}
        for group, p, theta_before, m_prev in self._before:
            params.append(p)
            delta.append(local(p).detach().double() - theta_before.double())
            by_group.setdefault(id(group), []).append((group, p, theta_before, m_prev))
        fresh, momentum, decay, precond = [], [], [], []
        for items in by_group.values():
            group = items[0][0]
            step = int(optimizer.state[items[0][1]]["step"])
            parts = adamw_step_parts(
                [t for _, _, t, _ in items],
                [local(p.grad) for _, p, _, _ in items],
                [m for _, _, _, m in items],
                [local(optimizer.state[p]["exp_avg_sq"]) for _, p, _, _ in items],
                step=step,
                lr=float(group["lr"]),
                betas=tuple(group["betas"]),
                eps=float(group["eps"]),
                weight_decay=float(group["weight_decay"]),
            )
            fresh += parts.fresh
            momentum += parts.momentum
            decay += parts.weight_decay
            precond += parts.preconditioner
        self.last = StepRecord(params, delta, AdamWStepParts(fresh, momentum, decay, precond))
        self._before = []
        for callback in self.on_step:
            callback(self.last)

    def predict(self, u: dict[torch.nn.Parameter, torch.Tensor] | list[torch.Tensor]) -> DeltaHPrediction:
        """u . delta for the last step; ``u`` per parameter (a dict, or a list in the optimizer's order)."""
        if self.last is None:
            raise RuntimeError("no optimizer step has been observed yet")
        u_list = [u[p] for p in self.last.params] if isinstance(u, dict) else list(u)
        return DeltaHPrediction(*self.last.dots_local(u_list).tolist())


def grads_of(scalar: torch.Tensor, params: list[torch.nn.Parameter], retain_graph: bool = False) -> list[torch.Tensor]:
    """d scalar / d params (zeros where unused), without touching ``.grad``."""
    grads = torch.autograd.grad(scalar, params, allow_unused=True, retain_graph=retain_graph)
    return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(params, grads, strict=True)]
