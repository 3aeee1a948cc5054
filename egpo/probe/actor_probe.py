"""The probe inside verl's FSDP actor: around ``DataParallelPPOActor.update_policy``.

On a probed update: one extra forward/backward of the token-mean entropy (verl's ``actor/entropy``) on the
update's batch gives u (gradients read from ``.grad``, which also works for FSDP2 parameters that are not
autograd leaves, then zeroed); AdamW step hooks record every optimizer step of the update; the predicted change
u . (theta_end - theta_start) and its fresh-gradient / momentum / weight-decay parts are summed over the steps
as local float64 dot products and all-reduced over the process group once. Optionally a no-grad re-forward
after the update measures the realised change on the same contexts. The training computation itself is not
touched: the extra backward's gradients are discarded before verl's update starts.

Metrics (``probe/``): ``entropy_before``, ``delta_h_pred``, ``delta_h_pred_fresh``, ``delta_h_pred_momentum``,
``delta_h_pred_weight_decay``, ``delta_h_realised`` (when ``egpo.probe.realised``), ``optimizer_steps``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from egpo.probe.settings import ProbeSettings
from egpo.probe.step_probe import AdamWStepProbe, dot64_local, local

ENTROPY_KEYS = ("responses", "input_ids", "attention_mask", "position_ids", "response_mask")


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


class ActorProbe:
    def __init__(self, actor, settings: ProbeSettings, device):
        self.actor = actor
        self.settings = settings
        self.device = device
        self.updates = 0
        self.step_probe = AdamWStepProbe(actor.actor_optimizer)
        self.step_probe.active = False
        self.step_probe.on_step.append(self._on_step)
        self._original_update = actor.update_policy
        self._u = None
        self._sums = None
        actor.update_policy = self.update_policy

    def _params(self):
        return [p for group in self.actor.actor_optimizer.param_groups for p in group["params"]]

    def _entropy_pass(self, data, with_grad: bool) -> torch.Tensor:
        """Token-mean entropy over the global batch; with_grad: its gradient accumulates into ``.grad``."""
        actor = self.actor
        keys = [k for k in ENTROPY_KEYS if k in data.batch.keys()]
        data = data.select(batch_keys=keys)
        local_tokens = data.batch["response_mask"].sum().double()
        tokens = _all_reduce(local_tokens.clone().to(self.device)).cpu()
        temperature = data.meta_info["temperature"]
        pad = data.meta_info.get("pad_token_id", 0)
        total = torch.zeros((), dtype=torch.float64)
        actor.actor_module.train()
        for mb in data.split(actor.config.ppo_micro_batch_size_per_gpu):
            mb = mb.to(self.device)
            inputs = {**mb.batch, **mb.non_tensor_batch, "pad_token_id": pad}
            with torch.set_grad_enabled(with_grad):
                out = actor._forward_micro_batch(inputs, temperature=temperature, calculate_entropy=True)
                # float64 reduction: the realised change of a small step is far below fp32's resolution of H
                part = (out["entropys"].double() * mb.batch["response_mask"].double()).sum() / tokens.item()
                if with_grad:
                    part.backward()
            total += part.detach().double().cpu()
        return _all_reduce(total.to(self.device)).cpu()

    def _on_step(self, record):
        parts = record.parts
        u = [self._u[p] for p in record.params]
        self._sums += torch.stack([
            dot64_local(u, record.delta),
            dot64_local(u, parts.fresh),
            dot64_local(u, parts.momentum),
            dot64_local(u, parts.weight_decay),
        ])
        self._steps += 1

    def update_policy(self, data):
        self.updates += 1
        if (self.updates - 1) % self.settings.every:
            return self._original_update(data)
        optimizer = self.actor.actor_optimizer
        optimizer.zero_grad()
        h_before = self._entropy_pass(data, with_grad=True)
        # FSDP averages gradients over the data-parallel ranks; the global mean's gradient is their sum
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self._u = {
            p: (local(p.grad).detach().double() * world if p.grad is not None
                else torch.zeros_like(local(p), dtype=torch.float64))
            for p in self._params()
        }
        optimizer.zero_grad()
        self._sums = torch.zeros(4, dtype=torch.float64)
        self._steps = 0
        self.step_probe.active = True
        try:
            metrics = self._original_update(data)
        finally:
            self.step_probe.active = False
        sums = _all_reduce(self._sums.to(self.device)).cpu()
        self._u = None
        metrics["probe/entropy_before"] = float(h_before)
        metrics["probe/delta_h_pred"] = float(sums[0])
        metrics["probe/delta_h_pred_fresh"] = float(sums[1])
        metrics["probe/delta_h_pred_momentum"] = float(sums[2])
        metrics["probe/delta_h_pred_weight_decay"] = float(sums[3])
        metrics["probe/optimizer_steps"] = float(self._steps)
        if self.settings.realised:
            h_after = self._entropy_pass(data, with_grad=False)
            metrics["probe/delta_h_realised"] = float(h_after - h_before)
        return metrics


def install_actor_probe(worker) -> ActorProbe | None:
    """Called by the worker after ``init_model``; a no-op unless ``egpo.probe.enable``."""
    from verl.utils.device import get_device_id

    from egpo.probe.settings import WORKER_KEY

    settings = ProbeSettings.from_config(worker.config.get(WORKER_KEY, None))
    if not settings.enable or not getattr(worker, "_is_actor", False):
        return None
    worker.egpo_probe = ActorProbe(worker.actor, settings, get_device_id())
    return worker.egpo_probe
