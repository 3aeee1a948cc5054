"""verl's engine-worker actor/rollout worker (``verl.workers.engine_workers.ActorRolloutRefWorker``), on a CPU.

Selected by ``trainer.device=cpu`` on verl 0.9.1 (:mod:`egpo.compat.workers`), with the ``cpu`` platform
(:mod:`egpo.cpu.platform`, ``VERL_PLATFORM=cpu``) answering verl's device questions. Before verl's ``__init__``:

* a ``gloo`` process group (verl asks for ``cpu:gloo,cpu:gloo`` when the device is the CPU, which torch refuses
  as a duplicate device type; verl skips its own init when a group exists);
* verl's FSDP engines registered for the ``cpu`` device (verl registers them for ``cuda`` and ``npu``);
* the ``hf`` rollout (:mod:`egpo.rollout.hf`) in verl's rollout registry, so the trainer's weights reach egpo's
  HF rollout server every step;

and the entropy probe's hook (:mod:`egpo.probe.engine_worker`), active when ``egpo.probe.enable``.
"""

from __future__ import annotations

from egpo.cpu.process_group import init_gloo_process_group
from egpo.probe.engine_worker import ProbeEngineActorRolloutRefWorker
from egpo.rollout.hf.adapter import register_hf_rollout

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
        init_gloo_process_group(int(config.get("nccl_timeout", 600)))
        register_cpu_engines()
        register_hf_rollout()
        if config.rollout.name == "sglang":
            from egpo.cpu.sglang_rollout import prepare_worker_for_sglang

            prepare_worker_for_sglang()
        super().__init__(config, role, **kwargs)
