"""Entry points of sglang's spawned processes with egpo's patches, and their injection into sglang's engine.

sglang 0.5.6.post2 starts each scheduler with ``mp.Process(target=run_scheduler_process)`` and the detokenizer
with ``mp.Process(target=run_detokenizer_process)`` under ``spawn``, looking both names up in
``sglang.srt.entrypoints.engine`` when it launches (verl passes the same engine attributes as
``run_*_process_func`` to sglang >= 0.5.7). Pointing them at the plain module-level functions below (pickled by
reference; no closure, no ``functools.wraps``) makes each child import this module when it unpickles its
target, before it imports anything of sglang's:

* importing this module installs the CPU stand-ins where they are needed
  (:func:`egpo.rollout.sglang.standins.prepare_sglang_import`; never on a CUDA machine);
* the scheduler applies the entropy patches before it builds its Scheduler, ModelRunner and Sampler, and on a GPU
  compiles the entropy kernel for the model's vocabulary then, not when the first request is sampled.

The entropy options travel in the environment (:mod:`egpo.rollout.sglang.options`).
"""

from __future__ import annotations

import os

from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.sglang.guards import SglangPatchTargetError, check_parameters
from egpo.rollout.sglang.options import export_options
from egpo.rollout.sglang.standins import prepare_sglang_import

CPU_STANDINS_ACTIVE = prepare_sglang_import()

SCHEDULER_PARAMS = ("server_args", "port_args", "gpu_id", "tp_rank", "moe_ep_rank", "pp_rank", "dp_rank", "pipe_writer")
DETOKENIZER_PARAMS = ("server_args", "port_args", "detokenizer_manager_class")

# On a CPU, sglang torch.compiles small helpers; inductor's start-up probing can stall for minutes on a loaded
# machine and buys nothing for a CPU rollout. Children inherit the parent's environment.
CPU_ENVIRONMENT = {"TORCHDYNAMO_DISABLE": "1"}


def run_scheduler_process_with_entropy(*args, **kwargs):
    """Runs inside the spawned scheduler process (sglang's arguments: :data:`SCHEDULER_PARAMS`)."""
    from sglang.srt.managers.scheduler import run_scheduler_process

    from egpo.rollout.sglang.options import read_options
    from egpo.rollout.sglang.sampler_patch import warm_sampler_kernel
    from egpo.rollout.sglang.scheduler_patches import apply_scheduler_patches

    options = read_options()
    apply_scheduler_patches(options)
    named = dict(zip(SCHEDULER_PARAMS, args))
    named.update(kwargs)
    warm_sampler_kernel(named["server_args"], named["gpu_id"], options)
    return run_scheduler_process(*args, **kwargs)


def run_detokenizer_process_with_standins(*args, **kwargs):
    """Runs inside the spawned detokenizer process (importing this module installed the stand-ins it needs)."""
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process

    return run_detokenizer_process(*args, **kwargs)


def _swap_engine_entry(engine, name: str, sglang_function, replacement, params: tuple[str, ...]) -> None:
    check_parameters(sglang_function, params, f"{sglang_function.__module__}.{name}")
    if name not in engine._launch_subprocesses.__code__.co_names:
        raise SglangPatchTargetError(
            f"sglang.srt.entrypoints.engine._launch_subprocesses no longer starts its processes through the module "
            f"attribute {name} (0.5.6.post2 does); egpo's patches would not run there"
        )
    current = getattr(engine, name, None)
    if current not in (sglang_function, replacement):
        raise SglangPatchTargetError(f"sglang.srt.entrypoints.engine.{name} is {current!r}, not sglang's; another patch owns it")
    engine.__dict__[name] = replacement


def install_process_entries(options: EntropyOptions) -> None:
    """In the process that launches sglang: check every target, export the options, swap the entries (idempotent).

    On a CPU machine (stand-ins active) also sets :data:`CPU_ENVIRONMENT` for the children.
    """
    import sglang.srt.entrypoints.engine as engine
    from sglang.srt.managers import detokenizer_manager, scheduler

    from egpo.rollout.sglang.scheduler_patches import check_scheduler_patch_targets

    check_scheduler_patch_targets()
    export_options(options)
    if CPU_STANDINS_ACTIVE:
        for key, value in CPU_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
    _swap_engine_entry(engine, "run_scheduler_process", scheduler.run_scheduler_process,
                       run_scheduler_process_with_entropy, SCHEDULER_PARAMS)
    _swap_engine_entry(engine, "run_detokenizer_process", detokenizer_manager.run_detokenizer_process,
                       run_detokenizer_process_with_standins, DETOKENIZER_PARAMS)


def remove_process_entries() -> None:
    import sglang.srt.entrypoints.engine as engine
    from sglang.srt.managers import detokenizer_manager, scheduler

    engine.run_scheduler_process = scheduler.run_scheduler_process
    engine.run_detokenizer_process = detokenizer_manager.run_detokenizer_process
