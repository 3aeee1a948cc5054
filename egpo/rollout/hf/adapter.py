"""Worker-side half of the ``hf`` rollout: pushes the trainer's weights to the HF rollout server.

In verl's hybrid engine the actor worker builds ``get_rollout_class(rollout.name, "async")`` and, every step,
calls its ``update_weights`` with the full (unsharded) parameters (``fsdp_workers.py``, ``rollout_mode``).
:func:`register_hf_rollout` adds ``("hf", "async")`` to verl's rollout registry in the calling process; the
CPU worker calls it before verl's ``__init__`` runs.
"""

from __future__ import annotations

import os
from typing import Generator

import ray
import torch
from torch.distributed.tensor import DTensor
from verl.workers.rollout.base import BaseRollout

from egpo.compat.versions import install_hint
from egpo.rollout.hf.names import hf_server_name

ROLLOUT_NAME = "hf"
ADAPTER_PATH = "egpo.rollout.hf.adapter.HFServerAdapter"


class HFServerAdapter(BaseRollout):
    """Holds no model: forwards weights to the replica's server actor (found by name)."""

    def __init__(self, config, model_config, device_mesh, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rollout_world_size = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.is_leader = rank % rollout_world_size == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(hf_server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None, **kwargs
    ):
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the hf rollout does not take LoRA weights; merge them or use sglang")
        # every rank must materialise its DTensors (a collective); only the replica leader sends them
        state = {}
        for name, tensor in weights:
            full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            if self.is_leader:
                state[name] = full.detach().to("cpu", copy=True)
        if self.is_leader:
            await self._server_handle().update_weights.remote(state, global_steps)


def register_hf_rollout() -> None:
    """Make ``actor_rollout_ref.rollout.name=hf`` resolvable by verl's ``get_rollout_class`` (idempotent)."""
    from verl.workers.rollout import base

    registry = getattr(base, "_ROLLOUT_REGISTRY", None)
    if not isinstance(registry, dict) or ("sglang", "async") not in registry:
        raise RuntimeError(
            "verl.workers.rollout.base._ROLLOUT_REGISTRY is not the {(name, mode): class path} dict of the verl "
            f"versions egpo is tested with; egpo cannot register its hf rollout. {install_hint()}"
        )
    existing = registry.get((ROLLOUT_NAME, "async"))
    if existing not in (None, ADAPTER_PATH):
        raise RuntimeError(f"verl already maps rollout name {ROLLOUT_NAME!r} to {existing}; egpo will not replace it")
    registry[(ROLLOUT_NAME, "async")] = ADAPTER_PATH
