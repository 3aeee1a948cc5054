"""The scheduler process's entry point with egpo's patches, and its injection into sglang's engine.

sglang 0.5.6.post2 starts each scheduler with ``mp.Process(target=run_scheduler_process)`` under ``spawn``,
looking the name up in ``sglang.srt.entrypoints.engine`` when it launches (and verl passes the same engine
attribute as ``run_scheduler_process_func`` to sglang >= 0.5.7). Pointing that attribute at
:func:`run_scheduler_process_with_entropy`, a plain module-level function (pickled by reference; no closure,
no ``functools.wraps``), makes every scheduler process apply the patches before it builds its Scheduler,
ModelRunner and Sampler. The entropy options travel in the environment (:mod:`egpo.rollout.sglang.options`).
"""

from __future__ import annotations

from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.sglang.guards import SglangPatchTargetError, check_parameters
from egpo.rollout.sglang.options import export_options

SCHEDULER_PARAMS = ("server_args", "port_args", "gpu_id", "tp_rank", "moe_ep_rank", "pp_rank", "dp_rank", "pipe_writer")


def run_scheduler_process_with_entropy(*args, **kwargs):
    """Runs inside the spawned scheduler process."""
    from sglang.srt.managers.scheduler import run_scheduler_process

    from egpo.rollout.sglang.options import read_options
    from egpo.rollout.sglang.scheduler_patches import apply_scheduler_patches

    apply_scheduler_patches(read_options())
    return run_scheduler_process(*args, **kwargs)


def install_scheduler_entry(options: EntropyOptions) -> None:
    """In the process that launches sglang: check every target, export the options, swap the entry (idempotent)."""
    import sglang.srt.entrypoints.engine as engine
    from sglang.srt.managers import scheduler

    from egpo.rollout.sglang.scheduler_patches import check_scheduler_patch_targets

    check_parameters(scheduler.run_scheduler_process, SCHEDULER_PARAMS, "sglang.srt.managers.scheduler.run_scheduler_process")
    if "run_scheduler_process" not in engine._launch_subprocesses.__code__.co_names:
        raise SglangPatchTargetError(
            "sglang.srt.entrypoints.engine._launch_subprocesses no longer starts schedulers through the module "
            "attribute run_scheduler_process (0.5.6.post2 does); egpo's scheduler patches would not run"
        )
    current = getattr(engine, "run_scheduler_process", None)
    if current not in (scheduler.run_scheduler_process, run_scheduler_process_with_entropy):
        raise SglangPatchTargetError(
            f"sglang.srt.entrypoints.engine.run_scheduler_process is {current!r}, not sglang's; another patch owns it"
        )
    check_scheduler_patch_targets()
    export_options(options)
    engine.run_scheduler_process = run_scheduler_process_with_entropy
