"""The actor/rollout worker verl builds, and egpo's replacement for a CPU run, per verl version.

* 0.7.1: verl's FSDP worker (``fsdp_workers.AsyncActorRolloutRefWorker``); egpo's CPU worker and probe worker
  extend it.
* 0.9.1: verl's engine worker (``engine_workers.ActorRolloutRefWorker``, the only one left); egpo's CPU worker
  extends it, with the ``cpu`` platform; the probe worker sets its ``actor_worker_cls`` to a probed
  ``TrainingWorker``.
"""

from __future__ import annotations

from egpo.compat.versions import verl_version

VERL_WORKER = {"0.7.1": "verl.workers.fsdp_workers.AsyncActorRolloutRefWorker",
               "0.9.1": "verl.workers.engine_workers.ActorRolloutRefWorker"}
CPU_WORKER = {"0.7.1": "egpo.cpu.worker.CpuActorRolloutRefWorker",
              "0.9.1": "egpo.cpu.engine_worker.CpuEngineActorRolloutRefWorker"}
PROBE_WORKER = {"0.7.1": "egpo.probe.worker.ProbeActorRolloutRefWorker",
                "0.9.1": "egpo.probe.engine_worker.ProbeEngineActorRolloutRefWorker"}


def _load(path: str):
    import importlib

    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def replacement_worker(verl_cls: type, on_cpu: bool, probe: bool) -> type | None:
    """egpo's worker for this run, or None to keep verl's; refuses a verl worker egpo does not extend."""
    version = verl_version()
    if not (on_cpu or probe):
        return None
    expected = _load(VERL_WORKER[version])
    if verl_cls is not expected:
        raise RuntimeError(
            f"verl {version} chose {verl_cls.__module__}.{verl_cls.__qualname__}, but egpo's workers extend "
            f"{VERL_WORKER[version]}; set actor_rollout_ref.actor.strategy=fsdp2"
            + (" and trainer.use_legacy_worker_impl=auto" if version == "0.7.1" else "")
        )
    return _load(CPU_WORKER[version] if on_cpu else PROBE_WORKER[version])
