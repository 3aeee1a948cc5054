"""The probe inside verl 0.7.1's FSDP actor: around ``DataParallelPPOActor.update_policy``.

The probe's logic is :class:`egpo.probe.update_probe.UpdateProbe`; here are its passes on this actor's batch
(a ``DataProto``) through the actor's own ``_forward_micro_batch``, split the way ``update_policy`` splits a
mini-batch: by ``ppo_micro_batch_size_per_gpu``, or under ``use_dynamic_bsz`` by the token budget
``ppo_max_token_len_per_gpu`` (verl's ``prepare_dynamic_batch``).
"""

from __future__ import annotations

import torch

from egpo.probe.settings import ProbeSettings
from egpo.probe.update_probe import UpdateProbe

ENTROPY_KEYS = ("responses", "input_ids", "attention_mask", "position_ids", "response_mask")


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class ActorProbe(UpdateProbe):
    def __init__(self, actor, settings: ProbeSettings, device):
        super().__init__(actor.actor_optimizer, settings, device, data_parallel_size=_world_size())
        self.actor = actor
        self._original_update = actor.update_policy
        actor.update_policy = self.update_policy

    def update_policy(self, data):
        metrics, probe_metrics = self.around_update(data, lambda: self._original_update(data))
        metrics.update(probe_metrics)
        return metrics

    def response_tokens(self, data) -> torch.Tensor:
        return data.batch["response_mask"].sum()

    def prompt_ids(self, data):
        return data.non_tensor_batch.get("uid", None)

    def select_rows(self, data, rows):
        keys = [k for k in (*ENTROPY_KEYS, "advantages") if k in data.batch.keys()]
        return data.select_idxs(rows).select(batch_keys=keys)

    def micro_batches(self, data) -> list:
        config = self.actor.config
        if config.use_dynamic_bsz:
            from verl.utils.seqlen_balancing import prepare_dynamic_batch

            budget = config.ppo_max_token_len_per_gpu * getattr(self.actor, "ulysses_sequence_parallel_size", 1)
            return prepare_dynamic_batch(data, max_token_len=budget)[0]
        return data.split(config.ppo_micro_batch_size_per_gpu)

    def train_mode(self):
        self.actor.actor_module.train()
        return super().train_mode()

    def pass_value(self, mb, target: str, tokens: float) -> torch.Tensor:
        mb = mb.to(self.device)
        inputs = {**mb.batch, **mb.non_tensor_batch, "pad_token_id": mb.meta_info.get("pad_token_id", 0)}
        out = self.actor._forward_micro_batch(inputs, temperature=mb.meta_info["temperature"], calculate_entropy=True)
        mask = mb.batch["response_mask"].to(out["entropys"].device).double()
        if target == "entropy":
            return (out["entropys"].double() * mask).sum() / tokens
        advantages = mb.batch["advantages"].to(out["log_probs"].device).double()
        return -(advantages * out["log_probs"].double() * mask).sum() / tokens


def install_actor_probe(worker) -> ActorProbe | None:
    """Called by the worker after ``init_model``; a no-op unless ``egpo.probe.enable``."""
    from verl.utils.device import get_device_id

    from egpo.probe.settings import WORKER_KEY

    settings = ProbeSettings.from_config(worker.config.get(WORKER_KEY, None))
    if not settings.enable or not getattr(worker, "_is_actor", False):
        return None
    worker.egpo_probe = ActorProbe(worker.actor, settings, get_device_id())
    return worker.egpo_probe
