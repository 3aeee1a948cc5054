"""The actor/rollout worker verl builds, and egpo's replacement for a CPU run, per verl version and worker family.

verl has two families of actor workers: the legacy ones (``fsdp_workers`` / ``megatron_workers``, whose FSDP actor
is ``DataParallelPPOActor``) and the model-engine ones (``engine_workers``). ``trainer.use_legacy_worker_impl``
chooses on verl 0.7.1 (``auto`` and ``enable``: legacy, verl's default; ``disable``: engine); verl 0.9.1 has only
the engine workers.

* 0.7.1 legacy: verl's FSDP worker (``fsdp_workers.AsyncActorRolloutRefWorker``); egpo's CPU worker and probe worker
  extend it.
* 0.7.1 engine and 0.9.1: verl's engine worker (``engine_workers.ActorRolloutRefWorker``); egpo's CPU worker extends
  it; on 0.9.1 the probe worker sets its ``actor_worker_cls`` to a probed ``TrainingWorker``.
"""

from __future__ import annotations

from egpo.compat.versions import WorkerFamily, verl_stack, verl_version


def worker_family(config, version: str | None = None) -> str:
    """``"legacy"`` or ``"engine"``: the actor workers verl builds for this config."""
    setting = str(config.trainer.get("use_legacy_worker_impl", "auto"))
    return "legacy" if setting in verl_stack(version).legacy_worker_settings else "engine"


def workers(config, version: str | None = None) -> WorkerFamily:
    """The table's entry for the worker family verl builds for this config (the installed verl, or ``version``)."""
    return verl_stack(version).workers[worker_family(config, version)]


def _load(path: str):
    import importlib

    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def replacement_worker(verl_cls: type, on_cpu: bool, probe: bool, family: str) -> type | None:
    """egpo's worker for this run, or None to keep verl's; refuses a verl worker egpo does not extend."""
    version = verl_version()
    if not (on_cpu or probe):
        return None
    entry = verl_stack(version).workers[family]
    expected = _load(entry.verl_worker)
    if verl_cls is not expected:
        raise RuntimeError(
            f"verl {version} chose {verl_cls.__module__}.{verl_cls.__qualname__}, but egpo's workers extend "
            f"{entry.verl_worker}; set actor_rollout_ref.actor.strategy=fsdp2"
        )
    return _load(entry.cpu_worker if on_cpu else entry.probe_worker)
