"""The probe inside verl's engine-worker actor (verl 0.9.1): around ``TrainingWorker.train_mini_batch``.

The probe's logic is :class:`egpo.probe.update_probe.UpdateProbe`; here are its passes on the engine's batch (a
no-padding ``TensorDict``, as ``RayPPOTrainer._update_actor`` sends it) through the engine's own
``forward_step``, with the flags ``TrainingWorker.train_batch`` gives the update's micro-batches (remove padding,
fused kernels, the batch-size settings), split the way the engine splits them: by ``micro_batch_size_per_gpu``
rows, or under ``use_dynamic_bsz`` by the token budget (verl's ``prepare_micro_batches``). The optimizer is the
engine's (``engine.optimizer``).

:class:`ProbeTrainingWorker` is the actor's ``TrainingWorker`` with the probe's hook; verl's
``ActorRolloutRefWorker`` builds its actor from the class attribute ``actor_worker_cls``
(:mod:`egpo.probe.engine_worker`).
"""

from __future__ import annotations

import numpy as np
import torch
from verl.single_controller.base.decorator import register
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn
from verl.utils import tensordict_utils as tu
from verl.workers.engine_workers import TrainingWorker
from verl.workers.utils.padding import no_padding_2_padding

from egpo.probe.settings import ProbeSettings
from egpo.probe.update_probe import UpdateProbe

# TrainingWorker.train_batch's per-micro-batch flags: (flag, where it lives on the worker)
TRAIN_FLAGS = (("use_remove_padding", "model_config"), ("use_dynamic_bsz", "engine_config"),
               ("max_token_len_per_gpu", "engine_config"), ("micro_batch_size_per_gpu", "engine_config"),
               ("use_fused_kernels", "engine_config"))


class EngineProbe(UpdateProbe):
    def __init__(self, worker: TrainingWorker, settings: ProbeSettings):
        from verl.utils.device import get_device_id

        engine = worker.engine
        super().__init__(engine.optimizer, settings, get_device_id(), data_parallel_size=engine.get_data_parallel_size())
        self.worker = worker

    def _flags(self) -> dict:
        worker = self.worker
        values = {}
        for flag, owner in TRAIN_FLAGS:
            source = getattr(worker, owner)
            values[flag] = source.get(flag, False) if owner == "model_config" else getattr(source, flag)
        return values

    def pass_data(self, data):
        """A shallow copy of the update's batch carrying what each of the update's micro-batches carries, and
        asking the engine for the entropy."""
        data = data.copy()
        tu.assign_non_tensor(data, **{k: v for k, v in self._flags().items() if k not in data.keys()})
        tu.assign_non_tensor(data, calculate_entropy=True, sp_size=getattr(self.worker.engine, "ulysses_sequence_parallel_size", 1))
        return data

    def response_tokens(self, data) -> torch.Tensor:
        return data["response_mask"].sum()

    def prompt_ids(self, data):
        uids = tu.get(data, "uid")
        return None if uids is None else np.asarray(uids, dtype=object)

    def select_rows(self, data, rows):
        return tu.index_select_tensor_dict(data, torch.as_tensor(np.asarray(rows), dtype=torch.long))

    def micro_batches(self, data) -> list:
        if tu.get_non_tensor_data(data, "use_dynamic_bsz", False):
            from verl.workers.engine.utils import prepare_micro_batches

            return prepare_micro_batches(data, dp_group=None, same_micro_num_in_dp=False)[0]
        size = tu.get_non_tensor_data(data, "micro_batch_size_per_gpu", None)
        rows = np.arange(len(data))
        return [self.select_rows(data, rows[i:i + size]) for i in range(0, len(rows), size)]

    def train_mode(self):
        return self.worker.engine.train_mode()

    def pass_value(self, mb, target: str, tokens: float) -> torch.Tensor:
        values = {}

        def capture(model_output, data, dp_group=None):
            key = "entropy" if target == "entropy" else "log_probs"
            per_token = no_padding_2_padding(model_output[key], data).double()
            padded = data.select(*(("response_mask",) if target == "entropy" else ("response_mask", "advantages")))
            padded = padded.to_padded_tensor()
            weight = padded["response_mask"].double()
            if target == "loss":
                weight = -padded["advantages"].double() * weight
            values["value"] = (per_token * weight.to(per_token.device)).sum() / tokens
            return values["value"], {}

        self.worker.engine.forward_step(mb, loss_function=capture, forward_only=not torch.is_grad_enabled())
        return values["value"]

    def train_mini_batch(self, data, update):
        data_for_probe = self.pass_data(data)
        output, metrics = self.around_update(data_for_probe, update)
        if output is not None and metrics:
            merged = dict(tu.get(output, "metrics"))
            merged.update(metrics)
            tu.assign_non_tensor(output, metrics=merged)
        return output


class ProbeTrainingWorker(TrainingWorker):
    """verl's ``TrainingWorker``; when :func:`install_engine_probe` gave it a probe, each ``train_mini_batch`` is
    probed (every ``egpo.probe.every``-th)."""

    egpo_probe: EngineProbe | None = None

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def train_mini_batch(self, data):
        if self.egpo_probe is None:
            return super().train_mini_batch(data)
        return self.egpo_probe.train_mini_batch(data, lambda: super(ProbeTrainingWorker, self).train_mini_batch(data))


def install_engine_probe(worker) -> EngineProbe | None:
    """Called by the actor/rollout worker after ``init_model``; a no-op unless ``egpo.probe.enable``."""
    from egpo.probe.settings import WORKER_KEY

    settings = ProbeSettings.from_config(worker.config.get(WORKER_KEY, None))
    if not settings.enable or not getattr(worker, "_is_actor", False):
        return None
    if not isinstance(worker.actor, ProbeTrainingWorker):
        raise TypeError(f"the probe needs egpo's ProbeTrainingWorker as the actor, got {type(worker.actor).__name__}")
    worker.actor.egpo_probe = EngineProbe(worker.actor, settings)
    return worker.actor.egpo_probe
