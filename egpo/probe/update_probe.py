"""The probe around one actor update, whatever runs the update's passes.

On a probed update: one extra forward/backward of the token-mean entropy (verl's ``actor/entropy``) on the
update's batch gives u (gradients read from ``.grad``, which also works for FSDP2 parameters that are not
autograd leaves, then zeroed); AdamW step hooks record every optimizer step of the update; the predicted change
u . (theta_end - theta_start) and its fresh-gradient / momentum / weight-decay parts are summed over the steps
as local float64 dot products and all-reduced over the process group once. Optionally a no-grad re-forward
after the update measures the realised change on the same contexts. The training computation itself is not
touched: the extra backward's gradients are discarded before verl's update starts.

Metrics (``probe/``): ``entropy_before``, ``delta_h_pred``, ``delta_h_pred_fresh``, ``delta_h_pred_momentum``,
``delta_h_pred_weight_decay``, ``delta_h_realised`` (when ``egpo.probe.realised``), ``optimizer_steps``.

Attribution (``egpo.probe.attribution``): before the update, per prompt group g (``uid``), U_g = grad of the
group's share of the entropy and G_g = grad of its share of the on-policy loss -(1/Z) sum A log pi; only
gradient-sized sums are kept (sum_g U_g * G_g, and U, G per half of the groups), and after the first optimizer
step the first step's effective preconditioner P turns them into ``attr_same_prompt``, ``attr_cross_prompt``
and ``attr_total`` (= -U . P G, the fresh part as the on-policy gradient sees it), ``pred_cross_prompt``
(cross pairs only, rescaled by B / (B - 1)) and ``pred_cross_fit`` (u from one half against the update from
the other, both ways, x2): the estimates free of the same-batch bias.

:class:`UpdateProbe` holds this logic once; a subclass says how verl's actor runs a pass on its batch format
(:mod:`egpo.probe.actor_probe` for verl 0.7.1's ``DataParallelPPOActor``, :mod:`egpo.probe.engine_probe` for
the engine workers' ``TrainingWorker``). Every pass is split into micro-batches the way that actor's update
splits them, so a prompt group of long responses never goes through one forward and backward whole.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from egpo.probe.attribution import bias_free_estimates
from egpo.probe.settings import ProbeSettings
from egpo.probe.step_probe import AdamWStepProbe, DeltaHPrediction, dot64_local, local


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


class UpdateProbe:
    """Subclasses say how their actor splits and runs a pass: :meth:`micro_batches`, :meth:`select_rows`,
    :meth:`pass_value`, :meth:`response_tokens`, :meth:`prompt_ids`, :meth:`train_mode`.

    Every pass is collective-safe under FSDP: each rank runs as many forward/backward passes as the rank with the
    most (a rank with fewer micro-batches, or none of a prompt group's rows, runs zero-weighted ones on a row of its
    own), so the sharded parameters' all-gathers and reduce-scatters stay in step. Prompt groups are the global
    ones (``uid`` gathered over the ranks): verl balances rows over ranks without regard to groups, and FSDP's
    reduce-scatter sums each rank's share of a group into the group's gradient.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, settings: ProbeSettings, device, data_parallel_size: int):
        self.optimizer = optimizer
        self.settings = settings
        self.device = device
        self.data_parallel_size = data_parallel_size
        self.updates = 0
        self.step_probe = AdamWStepProbe(optimizer)
        self.step_probe.active = False
        self.step_probe.on_step.append(self._on_step)
        self._u = None
        self._sums = None
        self._steps = 0
        self._first_precond = None

    # --- what a subclass provides ---------------------------------------------------------------------------
    def micro_batches(self, data) -> list:
        """``data`` split the way the actor's update splits a mini-batch (rows, or a token budget)."""
        raise NotImplementedError

    def select_rows(self, data, rows: np.ndarray):
        raise NotImplementedError

    def pass_value(self, micro_batch, target: str, tokens: float) -> torch.Tensor:
        """One micro-batch's share of the token-sum over response tokens, divided by ``tokens`` (float64 scalar):
        of the entropy (``target="entropy"``) or of the on-policy loss -A log pi (``"loss"``). Gradients flow when
        grad mode is on."""
        raise NotImplementedError

    def response_tokens(self, data) -> torch.Tensor:
        """This rank's number of response tokens in ``data`` (a scalar tensor)."""
        raise NotImplementedError

    def prompt_ids(self, data) -> np.ndarray | None:
        """The prompt id (``uid``) of each row, or None when the batch has none."""
        raise NotImplementedError

    def train_mode(self):
        """A context in which the actor's module runs a training forward (parameters loaded, train mode)."""
        return contextlib.nullcontext()

    # --- shared ---------------------------------------------------------------------------------------------
    def params(self) -> list[torch.nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def global_tokens(self, data) -> float:
        return float(all_reduce(self.response_tokens(data).double().to(self.device)).cpu())

    def global_grads(self) -> list[torch.Tensor]:
        """This rank's shard of the gradient of a global mean, float64 (zeros where unused).

        FSDP averages gradients over the data-parallel ranks; the global mean's gradient is their sum.
        """
        world = self.data_parallel_size
        return [local(p.grad).detach().double() * world if p.grad is not None
                else torch.zeros_like(local(p), dtype=torch.float64) for p in self.params()]

    def _run_passes(self, micro_batches: list, data, target: str, tokens: float, with_grad: bool) -> torch.Tensor:
        """Sum of :meth:`pass_value` over ``micro_batches`` (backward each when ``with_grad``), padded with
        zero-weighted passes on a row of ``data`` up to the most micro-batches any rank has. Local float64 sum."""
        count = torch.tensor(len(micro_batches), dtype=torch.int64, device=self.device)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(count, op=dist.ReduceOp.MAX)
        total = torch.zeros((), dtype=torch.float64)
        filler = None  # selected only on a rank that runs short of micro-batches
        for i in range(int(count)):
            with torch.set_grad_enabled(with_grad):
                if i < len(micro_batches):
                    value = self.pass_value(micro_batches[i], target, tokens)
                else:
                    filler = self.select_rows(data, np.arange(1)) if filler is None else filler
                    value = self.pass_value(filler, target, tokens) * 0.0
                if with_grad:
                    value.backward()
            total += value.detach().double().cpu()
        return total

    def entropy_pass(self, data, with_grad: bool) -> torch.Tensor:
        """Token-mean entropy over the global batch (float64, CPU); with_grad: its gradient accumulates into
        ``.grad`` as a global mean's would. Float64 reductions: a small step's realised change is far below fp32's
        resolution of H."""
        tokens = self.global_tokens(data)
        total = self._run_passes(self.micro_batches(data), data, "entropy", tokens, with_grad)
        return all_reduce(total.to(self.device)).cpu()

    def group_grads(self, data, rows: np.ndarray, target: str, tokens: float) -> list[torch.Tensor]:
        """Float64 gradient (this rank's shard) of one prompt group's share of the entropy or of the loss, its rows
        on every rank accumulated over their micro-batches."""
        self.optimizer.zero_grad()
        mbs = self.micro_batches(self.select_rows(data, rows)) if len(rows) else []
        self._run_passes(mbs, data, target, tokens, with_grad=True)
        return self.global_grads()

    def _global_groups(self, uids: np.ndarray) -> list:
        """Prompt ids over all ranks, in rank order then first appearance (the same list on every rank)."""
        mine = list(dict.fromkeys(uids.tolist()))
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return mine
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        return list(dict.fromkeys(uid for part in gathered for uid in part))

    def _attribution_pass(self, data) -> dict:
        uids = self.prompt_ids(data)
        if uids is None:
            raise ValueError("egpo.probe.attribution needs the batch's prompt ids (non_tensor_batch['uid'])")
        uids = np.asarray(uids, dtype=object)
        groups = self._global_groups(uids)
        if len(groups) < 2:
            raise ValueError("egpo.probe.attribution needs at least two prompt groups in an update")
        tokens = self.global_tokens(data)
        zeros = [torch.zeros_like(local(p), dtype=torch.float64) for p in self.params()]
        acc = {"same": [z.clone() for z in zeros], "u0": [z.clone() for z in zeros], "u1": [z.clone() for z in zeros],
               "g0": [z.clone() for z in zeros], "g1": [z.clone() for z in zeros]}
        for k, uid in enumerate(groups):
            rows = np.nonzero(uids == uid)[0]
            u_g = self.group_grads(data, rows, "entropy", tokens)
            g_g = self.group_grads(data, rows, "loss", tokens)
            half = 0 if k < len(groups) // 2 else 1
            for i in range(len(zeros)):
                acc["same"][i] += u_g[i] * g_g[i]
                acc[f"u{half}"][i] += u_g[i]
                acc[f"g{half}"][i] += g_g[i]
        self.optimizer.zero_grad()
        acc["groups"] = len(groups)
        return acc

    def _attribution_metrics(self, acc, precond) -> dict:
        def contract(a, b):  # -sum P * a * b, local then all-reduced
            return -sum(dot64_local([p * x], [y]) for p, x, y in zip(precond, a, b, strict=True))

        u_all = [x + y for x, y in zip(acc["u0"], acc["u1"], strict=True)]
        g_all = [x + y for x, y in zip(acc["g0"], acc["g1"], strict=True)]
        values = torch.stack([
            -sum(dot64_local([p], [s]) for p, s in zip(precond, acc["same"], strict=True)),
            contract(u_all, g_all),
            contract(acc["u0"], acc["g1"]) + contract(acc["u1"], acc["g0"]),
        ])
        same, total, off_half = (float(v) for v in all_reduce(values.to(self.device)).cpu())
        estimates = bias_free_estimates(total, same, off_half, acc["groups"])
        return {
            "probe/attr_same_prompt": same,
            "probe/attr_cross_prompt": total - same,
            "probe/attr_total": total,
            "probe/pred_cross_prompt": estimates["cross_prompt"],
            "probe/pred_cross_fit": estimates["cross_fit"],
        }

    def _on_step(self, record):
        if self._first_precond is None:
            self._first_precond = dict(zip(record.params, record.parts.preconditioner, strict=True))
        self._sums += record.dots_local([self._u[p] for p in record.params])
        self._steps += 1

    def around_update(self, data, update: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
        """Runs ``update()`` (verl's update of ``data``), probed when this update is due; returns its result and the
        probe's metrics ({} when not probed)."""
        self.updates += 1
        if (self.updates - 1) % self.settings.every:
            return update(), {}
        with self.train_mode():  # gradients are read inside: an engine may zero them when its train mode ends
            attribution = self._attribution_pass(data) if self.settings.attribution else None
            self.optimizer.zero_grad()
            h_before = self.entropy_pass(data, with_grad=True)
            self._u = dict(zip(self.params(), self.global_grads(), strict=True))
            self.optimizer.zero_grad()
        self._sums = torch.zeros(4, dtype=torch.float64)
        self._steps = 0
        self._first_precond = None
        self.step_probe.active = True
        try:
            result = update()
        finally:
            self.step_probe.active = False
        sums = all_reduce(self._sums.to(self.device)).cpu()
        self._u = None
        metrics = {"probe/entropy_before": float(h_before)}
        metrics.update(DeltaHPrediction(*sums.tolist()).as_metrics())
        metrics["probe/optimizer_steps"] = float(self._steps)
        if attribution is not None and self._first_precond is not None:
            precond = [self._first_precond.get(p, torch.zeros_like(local(p), dtype=torch.float64)) for p in self.params()]
            metrics.update(self._attribution_metrics(attribution, precond))
        self._first_precond = None
        if self.settings.realised:
            with self.train_mode():
                h_after = self.entropy_pass(data, with_grad=False)
            metrics["probe/delta_h_realised"] = float(h_after - h_before)
        return result, metrics
