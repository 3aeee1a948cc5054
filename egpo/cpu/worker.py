"""verl's FSDP actor/rollout worker, on a CPU.

Selected by ``trainer.device=cpu`` (see :class:`egpo.main.EgpoTaskRunner`). Differences from
``verl.workers.fsdp_workers.AsyncActorRolloutRefWorker``, all made before its ``__init__`` runs:

* the process group is ``gloo`` only (verl asks for ``cpu:gloo,cpu:nccl``, which torch refuses as a
  duplicate device type when the device is the CPU);
* ``torch.cpu`` gets the memory functions verl's memory logging calls (:mod:`egpo.cpu.memory`);
* the ``hf`` rollout (:mod:`egpo.rollout.hf`) is registered in this process, so the hybrid engine's weight
  sync pushes the trainer's weights to the HF rollout server every step; with ``rollout.name=sglang``, verl's
  own sglang adapter pushes them, with CPU tensors shared by file name and the worker's device slot declared (:mod:`egpo.cpu.sglang_rollout`);
* the entropy probe is installed when ``egpo.probe.enable`` (:mod:`egpo.probe.worker`).
"""

from __future__ import annotations

from egpo.cpu.memory import install_cpu_memory_stats
from egpo.cpu.process_group import init_gloo_process_group
from egpo.cpu.sglang_rollout import prepare_worker_for_sglang
from egpo.probe.worker import ProbeActorRolloutRefWorker
from egpo.rollout.hf.adapter import register_hf_rollout


class CpuActorRolloutRefWorker(ProbeActorRolloutRefWorker):
    """verl's ``AsyncActorRolloutRefWorker`` (with egpo's probe hook) plus a gloo process group, CPU memory stats
    and the ``hf`` rollout."""

    def __init__(self, config, role: str, **kwargs):
        init_gloo_process_group(int(config.get("nccl_timeout", 600)))
        install_cpu_memory_stats()
        register_hf_rollout()
        if config.rollout.name == "sglang":
            prepare_worker_for_sglang()
        super().__init__(config, role, **kwargs)
