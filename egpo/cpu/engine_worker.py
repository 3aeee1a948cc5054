"""verl's engine-worker actor/rollout worker (``verl.workers.engine_workers.ActorRolloutRefWorker``), on a CPU.

Selected by ``trainer.device=cpu`` on verl 0.9.1 (:mod:`egpo.compat.workers`), with the ``cpu`` platform
(:mod:`egpo.cpu.platform`, ``VERL_PLATFORM=cpu``) answering verl's device questions. Before verl's ``__init__``:

* what every egpo CPU worker does (:mod:`egpo.cpu.worker_setup`): a ``gloo`` process group, the ``hf`` rollout in
  verl's rollout registry, and for ``rollout.name=sglang`` the trainer side of verl's weight push;
* verl's FSDP engines registered for the ``cpu`` device (verl registers them for ``cuda`` and ``npu``);
* ``torch.cpu`` memory statistics (:mod:`egpo.cpu.memory`) and, on verl 0.7.1 (whose engine workers it also serves,
  ``trainer.use_legacy_worker_impl=disable``), verl's pure-torch padding helpers (:mod:`egpo.cpu.padding`);

and the entropy probe's hook (:mod:`egpo.probe.engine_worker`), active when ``egpo.probe.enable``.
"""

from __future__ import annotations

from egpo.cpu.memory import install_cpu_memory_stats
from egpo.cpu.padding import use_torch_padding
from egpo.cpu.worker_setup import prepare_cpu_worker
from egpo.probe.engine_worker import ProbeEngineActorRolloutRefWorker

ENGINES = (("language_model", "FSDPEngineWithLMHead"), ("value_model", "FSDPEngineWithValueHead"))


def register_cpu_engines() -> None:
    """verl's FSDP engine classes, registered for the ``cpu`` device too (idempotent)."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    for model_type, name in ENGINES:
        for backend in ("fsdp", "fsdp2"):
            if "cpu" not in EngineRegistry._engines.get(model_type, {}).get(backend, {}):
                EngineRegistry.register(model_type=model_type, backend=backend, device="cpu")(getattr(transformer_impl, name))


class CpuEngineActorRolloutRefWorker(ProbeEngineActorRolloutRefWorker):
    def __init__(self, config, role: str, **kwargs):
        prepare_cpu_worker(config)
        install_cpu_memory_stats()
        use_torch_padding()
        register_cpu_engines()
        super().__init__(config, role, **kwargs)
