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

Attribution (``egpo.probe.attribution``): before the update, per prompt group g (``uid``), U_g = grad of the
group's share of the entropy and G_g = grad of its share of the on-policy loss -(1/Z) sum A log pi; only
gradient-sized sums are kept (sum_g U_g * G_g, and U, G per half of the groups), and after the first optimizer
step the first step's effective preconditioner P turns them into ``attr_same_prompt``, ``attr_cross_prompt``
and ``attr_total`` (= -U . P G, the fresh part as the on-policy gradient sees it), ``pred_cross_prompt``
(cross pairs only, rescaled by B / (B - 1)) and ``pred_cross_fit`` (u from one half against the update from
the other, both ways, x2): the estimates free of the same-batch bias.

Every pass is split the way verl's update splits its mini-batches: by ``ppo_micro_batch_size_per_gpu``, or under
``use_dynamic_bsz`` by the token budget ``ppo_max_token_len_per_gpu`` (verl's ``prepare_dynamic_batch``). A prompt
group's gradients in attribution accumulate over such micro-batches, so a group of long responses never goes
through one forward and backward whole.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from egpo.probe.attribution import bias_free_estimates
from egpo.probe.settings import ProbeSettings
from egpo.probe.step_probe import AdamWStepProbe, DeltaHPrediction, dot64_local, local

ENTROPY_KEYS = ("responses", "input_ids", "attention_mask", "position_ids", "response_mask")


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if _world_size() > 1:
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
        self._steps = 0
        self._first_precond = None
        actor.update_policy = self.update_policy

    def _params(self):
        return [p for group in self.actor.actor_optimizer.param_groups for p in group["params"]]

    def _global_grads(self) -> list[torch.Tensor]:
        """This rank's shard of the gradient of a global mean, float64 (zeros where unused).

        FSDP averages gradients over the data-parallel ranks; the global mean's gradient is their sum.
        """
        world = _world_size()
        return [local(p.grad).detach().double() * world if p.grad is not None
                else torch.zeros_like(local(p), dtype=torch.float64) for p in self._params()]

    def _micro_batches(self, data) -> list:
        """``data`` split as verl's ``update_policy`` splits a mini-batch (rows, or a token budget)."""
        config = self.actor.config
        if config.use_dynamic_bsz:
            from verl.utils.seqlen_balancing import prepare_dynamic_batch

            budget = config.ppo_max_token_len_per_gpu * getattr(self.actor, "ulysses_sequence_parallel_size", 1)
            return prepare_dynamic_batch(data, max_token_len=budget)[0]
        return data.split(config.ppo_micro_batch_size_per_gpu)

    def _forward(self, mb, meta_info) -> dict:
        mb = mb.to(self.device)
        inputs = {**mb.batch, **mb.non_tensor_batch, "pad_token_id": meta_info.get("pad_token_id", 0)}
        return self.actor._forward_micro_batch(inputs, temperature=meta_info["temperature"], calculate_entropy=True)

    def _entropy_pass(self, data, with_grad: bool) -> torch.Tensor:
        """Token-mean entropy over the global batch; with_grad: its gradient accumulates into ``.grad``."""
        keys = [k for k in ENTROPY_KEYS if k in data.batch.keys()]
        data = data.select(batch_keys=keys)
        tokens = float(_all_reduce(data.batch["response_mask"].sum().double().to(self.device)).cpu())
        total = torch.zeros((), dtype=torch.float64)
        self.actor.actor_module.train()
        for mb in self._micro_batches(data):
            with torch.set_grad_enabled(with_grad):
                out = self._forward(mb, data.meta_info)
                # float64 reduction: the realised change of a small step is far below fp32's resolution of H
                mask = mb.batch["response_mask"].to(out["entropys"].device).double()
                part = (out["entropys"].double() * mask).sum() / tokens
                if with_grad:
                    part.backward()
            total += part.detach().double().cpu()
        return _all_reduce(total.to(self.device)).cpu()

    def _group_pass(self, data, rows, target: str, tokens: float) -> list:
        """Local float64 gradient of one group's share of the entropy ("entropy") or of the loss ("loss"),
        accumulated over the group's micro-batches."""
        sub = data.select_idxs(rows)
        keys = [k for k in (*ENTROPY_KEYS, "advantages") if k in sub.batch.keys()]
        sub = sub.select(batch_keys=keys)
        self.actor.actor_optimizer.zero_grad()
        for mb in self._micro_batches(sub):
            out = self._forward(mb, data.meta_info)
            batch = mb.batch.to(out["entropys"].device)
            mask = batch["response_mask"].double()
            if target == "entropy":
                value = (out["entropys"].double() * mask).sum() / tokens
            else:
                value = -(batch["advantages"].double() * out["log_probs"].double() * mask).sum() / tokens
            value.backward()
        return self._global_grads()

    def _attribution_pass(self, data) -> dict:
        import numpy as np

        uids = data.non_tensor_batch.get("uid", None)
        if uids is None:
            raise ValueError("egpo.probe.attribution needs the batch's prompt ids (non_tensor_batch['uid'])")
        groups = list(dict.fromkeys(uids.tolist()))
        if len(groups) < 2:
            raise ValueError("egpo.probe.attribution needs at least two prompt groups in an update")
        tokens = float(_all_reduce(data.batch["response_mask"].sum().double().to(self.device)).cpu())
        zeros = [torch.zeros_like(local(p), dtype=torch.float64) for p in self._params()]
        acc = {"same": [z.clone() for z in zeros], "u0": [z.clone() for z in zeros], "u1": [z.clone() for z in zeros],
               "g0": [z.clone() for z in zeros], "g1": [z.clone() for z in zeros]}
        for k, uid in enumerate(groups):
            rows = np.nonzero(uids == uid)[0]
            u_g = self._group_pass(data, rows, "entropy", tokens)
            g_g = self._group_pass(data, rows, "loss", tokens)
            half = 0 if k < len(groups) // 2 else 1
            for i in range(len(zeros)):
                acc["same"][i] += u_g[i] * g_g[i]
                acc[f"u{half}"][i] += u_g[i]
                acc[f"g{half}"][i] += g_g[i]
        self.actor.actor_optimizer.zero_grad()
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
        same, total, off_half = (float(v) for v in _all_reduce(values.to(self.device)).cpu())
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

    def update_policy(self, data):
        self.updates += 1
        if (self.updates - 1) % self.settings.every:
            return self._original_update(data)
        optimizer = self.actor.actor_optimizer
        attribution = self._attribution_pass(data) if self.settings.attribution else None
        optimizer.zero_grad()
        h_before = self._entropy_pass(data, with_grad=True)
        self._u = dict(zip(self._params(), self._global_grads(), strict=True))
        optimizer.zero_grad()
        self._sums = torch.zeros(4, dtype=torch.float64)
        self._steps = 0
        self._first_precond = None
        self.step_probe.active = True
        try:
            metrics = self._original_update(data)
        finally:
            self.step_probe.active = False
        sums = _all_reduce(self._sums.to(self.device)).cpu()
        self._u = None
        metrics["probe/entropy_before"] = float(h_before)
        metrics.update(DeltaHPrediction(*sums.tolist()).as_metrics())
        metrics["probe/optimizer_steps"] = float(self._steps)
        if attribution is not None and self._first_precond is not None:
            precond = [self._first_precond.get(p, torch.zeros_like(local(p), dtype=torch.float64)) for p in self._params()]
            metrics.update(self._attribution_metrics(attribution, precond))
        self._first_precond = None
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
