"""verl's FSDP actor/rollout worker, on a CPU.

Selected by ``trainer.device=cpu`` (see :class:`egpo.runner.EgpoTaskRunner`). Differences from
``verl.workers.fsdp_workers.AsyncActorRolloutRefWorker``, all made before its ``__init__`` runs:

* what every egpo CPU worker does (:mod:`egpo.cpu.worker_setup`): a ``gloo``-only process group, the ``hf``
  rollout (:mod:`egpo.rollout.hf`) registered in this process, so the hybrid engine's weight sync pushes the
  trainer's weights to the HF rollout server every step, and with ``rollout.name=sglang`` the trainer side of
  verl's own sglang weight push (:mod:`egpo.cpu.sglang_rollout`);
* ``torch.cpu`` gets the memory functions verl's memory logging calls (:mod:`egpo.cpu.memory`);
* the entropy probe is installed when ``egpo.probe.enable`` (:mod:`egpo.probe.worker`).
"""

from __future__ import annotations

from egpo.cpu.memory import install_cpu_memory_stats
from egpo.cpu.worker_setup import prepare_cpu_worker
from egpo.probe.worker import ProbeActorRolloutRefWorker


class CpuActorRolloutRefWorker(ProbeActorRolloutRefWorker):
    """verl's ``AsyncActorRolloutRefWorker`` (with egpo's probe hook) plus a gloo process group, CPU memory stats
    and the ``hf`` rollout."""

    def __init__(self, config, role: str, **kwargs):
        prepare_cpu_worker(config)
        install_cpu_memory_stats()
        super().__init__(config, role, **kwargs)
