"""How egpo's patches reach sglang's spawned processes, per sglang version (:mod:`egpo.rollout.sglang.versions`).

sglang starts each scheduler with ``mp.Process(target=run_scheduler_process)`` and the detokenizer with
``mp.Process(target=run_detokenizer_process)`` under ``spawn``. 0.5.6.post2 looks both names up in
``sglang.srt.entrypoints.engine`` when it launches; 0.5.12 takes them as ``Engine._launch_subprocesses`` arguments
(verl 0.9.1 passes that module's attributes, a plain ``sglang.Engine`` its class attributes
``run_scheduler_process_func`` / ``run_detokenizer_process_func``). Pointing them at the plain module-level
functions below (pickled by reference; no closure, no ``functools.wraps``) makes each child import this module when
it unpickles its target, before it imports anything of sglang's:

* importing this module installs the CPU stand-ins where they are needed
  (:func:`egpo.rollout.sglang.standins.prepare_sglang_import`; never on a CUDA machine);
* on 0.5.6.post2 the scheduler entry applies the entropy patches before sglang builds its Scheduler, ModelRunner
  and Sampler, and on a GPU compiles the entropy kernel for the model's vocabulary then.

On 0.5.12 the patches come from sglang's own plugin hook instead (:mod:`egpo.rollout.sglang.plugin`), so on a GPU
nothing of sglang's is swapped; the entries are swapped only on a CPU-only machine, for the stand-ins.

The entropy options travel in the environment (:mod:`egpo.rollout.engine_options`).
"""

from __future__ import annotations

import os

from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.sglang.versions import SglangPatchTargetError, check_parameters, import_target, sglang_version
from egpo.rollout.engine_options import export_options
from egpo.rollout.sglang.standins import prepare_sglang_import

CPU_STANDINS_ACTIVE = prepare_sglang_import()

DETOKENIZER_PARAMS = ("server_args", "port_args", "detokenizer_manager_class")
PLUGIN_GROUP, PLUGIN_NAME = "sglang.srt.plugins", "egpo_rollout_entropy"

# On a CPU, sglang torch.compiles small helpers; inductor's start-up probing can stall for minutes on a loaded
# machine and buys nothing for a CPU rollout. Children inherit the parent's environment.
CPU_ENVIRONMENT = {"TORCHDYNAMO_DISABLE": "1"}


def run_scheduler_process_with_entropy(*args, **kwargs):
    """Runs inside the spawned scheduler process (0.5.6.post2; sglang's arguments: ``scheduler_entry_params``)."""
    from sglang.srt.managers.scheduler import run_scheduler_process

    from egpo.rollout.engine_options import read_options
    from egpo.rollout.sglang.sampler_patch import warm_sampler_kernel
    from egpo.rollout.sglang.scheduler_patches import apply_scheduler_patches
    from egpo.rollout.sglang.versions import sglang_targets

    options = read_options()
    apply_scheduler_patches(options)
    named = dict(zip(sglang_targets().scheduler_entry_params, args))
    named.update(kwargs)
    warm_sampler_kernel(named["server_args"], named["gpu_id"], options)
    return run_scheduler_process(*args, **kwargs)


def run_scheduler_process_with_standins(*args, **kwargs):
    """Runs inside the spawned scheduler process (0.5.12, CPU: importing this module installed the stand-ins;
    sglang's plugin hook applies the patches)."""
    from sglang.srt.managers.scheduler import run_scheduler_process

    from egpo.rollout.sglang.standins import unpin_host_tensors
    from egpo.rollout.sglang.versions import sglang_targets

    if sglang_targets().pins_host_tensors:
        unpin_host_tensors()
    return run_scheduler_process(*args, **kwargs)


def run_data_parallel_controller_with_standins(*args, **kwargs):
    """Runs inside the spawned data-parallel controller (0.5.12, CPU: importing this module installed the stand-ins;
    it starts the schedulers with the entry the engine hands it, egpo's)."""
    from sglang.srt.managers.data_parallel_controller import run_data_parallel_controller_process

    return run_data_parallel_controller_process(*args, **kwargs)


def run_detokenizer_process_with_standins(*args, **kwargs):
    """Runs inside the spawned detokenizer process (importing this module installed the stand-ins it needs)."""
    from sglang.srt.managers.detokenizer_manager import run_detokenizer_process

    return run_detokenizer_process(*args, **kwargs)


def _swap_module_entry(engine, name: str, sglang_function, replacement, params: tuple[str, ...],
                       launcher_reads_it: bool) -> None:
    check_parameters(sglang_function, params, f"{sglang_function.__module__}.{name}")
    if launcher_reads_it and name not in engine._launch_subprocesses.__code__.co_names:
        raise SglangPatchTargetError(
            f"sglang {sglang_version()}: sglang.srt.entrypoints.engine._launch_subprocesses no longer starts its "
            f"processes through the module attribute {name}; egpo's patches would not run there"
        )
    current = getattr(engine, name, None)
    if current not in ENTRIES.get(name, ()) + (sglang_function,):
        raise SglangPatchTargetError(f"sglang.srt.entrypoints.engine.{name} is {current!r}, not sglang's; another patch owns it")
    engine.__dict__[name] = replacement


def _swap_class_entry(engine_cls, attr: str, sglang_function, replacement) -> None:
    """``Engine.run_*_process_func`` (sglang >= 0.5.10), which ``Engine.__init__`` passes to its launcher."""
    import inspect

    launch_params = tuple(inspect.signature(engine_cls._launch_subprocesses).parameters)
    current = inspect.getattr_static(engine_cls, attr, None)
    current = getattr(current, "__func__", current)
    if attr not in launch_params or current not in (sglang_function, replacement):
        raise SglangPatchTargetError(
            f"sglang {sglang_version()}: Engine.{attr} is {current!r} and Engine._launch_subprocesses takes "
            f"{launch_params}; egpo expected sglang's own entry passed as {attr}"
        )
    setattr(engine_cls, attr, staticmethod(replacement))


def scheduler_entry():
    """The scheduler entry egpo points sglang at, for the installed sglang (and the plain reference's counterpart
    in tests): 0.5.6.post2 patches there, 0.5.12 only installs the stand-ins (its plugin patches)."""
    from egpo.rollout.sglang.versions import sglang_targets

    return run_scheduler_process_with_standins if sglang_targets().patches_via_plugin else run_scheduler_process_with_entropy


def set_engine_entries(scheduler_fn, detokenizer_fn) -> None:
    """Point every place this sglang's launcher reads its children's entries from at these (tests' probes)."""
    import sglang.srt.entrypoints.engine as engine

    engine.run_scheduler_process = scheduler_fn
    engine.run_detokenizer_process = detokenizer_fn
    if hasattr(engine, "Engine") and hasattr(engine.Engine, "run_scheduler_process_func"):
        engine.Engine.run_scheduler_process_func = staticmethod(scheduler_fn)
        engine.Engine.run_detokenizer_process_func = staticmethod(detokenizer_fn)


ENTRIES = {"run_scheduler_process": (run_scheduler_process_with_entropy, run_scheduler_process_with_standins),
           "run_detokenizer_process": (run_detokenizer_process_with_standins,),
           "run_data_parallel_controller_process": (run_data_parallel_controller_with_standins,)}


def check_plugin_registered() -> None:
    """sglang (0.5.12 and later) will load egpo's plugin in its scheduler processes (installed entry point, not filtered out)."""
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}
    if names.get(PLUGIN_NAME) != "egpo.rollout.sglang.plugin:load":
        raise SglangPatchTargetError(
            f"egpo's {PLUGIN_GROUP} entry point {PLUGIN_NAME} is not installed (found {sorted(names)}); reinstall egpo "
            "(pip install -e .) so sglang loads its entropy patches in the scheduler processes"
        )
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    if allowed and PLUGIN_NAME not in {x.strip() for x in allowed.split(",")}:
        raise SglangPatchTargetError(f"SGLANG_PLUGINS={allowed!r} leaves out egpo's plugin; add {PLUGIN_NAME} to it")


def install_process_entries(options: EntropyOptions) -> None:
    """In the process that launches sglang: check every target, export the options, and reach the children
    (idempotent). On a CPU machine (stand-ins active) also sets :data:`CPU_ENVIRONMENT` for the children."""
    from egpo.rollout.sglang.scheduler_patches import check_scheduler_patch_targets
    from egpo.rollout.sglang.versions import sglang_targets

    targets = sglang_targets()
    engine = import_target("sglang.srt.entrypoints.engine")
    detokenizer_manager = import_target("sglang.srt.managers.detokenizer_manager")
    scheduler = import_target("sglang.srt.managers.scheduler")
    if targets.entropy_via_observer:
        from egpo.rollout.sglang.observer import check_observer_targets

        check_observer_targets()
    else:
        check_scheduler_patch_targets()
    check_parameters(scheduler.run_scheduler_process, targets.scheduler_entry_params,
                     "sglang.srt.managers.scheduler.run_scheduler_process")
    if targets.patches_via_plugin:
        check_plugin_registered()
    export_options(options)
    if CPU_STANDINS_ACTIVE:
        for key, value in CPU_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
    if targets.patches_via_plugin and not CPU_STANDINS_ACTIVE:
        return  # a GPU machine: sglang's plugin hook does it all
    scheduler_fn = scheduler_entry()
    launcher_reads_module = not targets.engine_entries_on_class
    _swap_module_entry(engine, "run_scheduler_process", scheduler.run_scheduler_process, scheduler_fn,
                       targets.scheduler_entry_params, launcher_reads_module)
    _swap_module_entry(engine, "run_detokenizer_process", detokenizer_manager.run_detokenizer_process,
                       run_detokenizer_process_with_standins, DETOKENIZER_PARAMS, launcher_reads_module)
    if targets.data_parallel_reaches_schedulers:  # the controller process needs the stand-ins too
        controller = import_target("sglang.srt.managers.data_parallel_controller")
        if "run_data_parallel_controller_process" not in engine.Engine._launch_scheduler_processes.__code__.co_names:
            raise SglangPatchTargetError(
                f"sglang {sglang_version()}: Engine._launch_scheduler_processes no longer starts the data-parallel "
                "controller through the module attribute run_data_parallel_controller_process"
            )
        _swap_module_entry(engine, "run_data_parallel_controller_process",
                           controller.run_data_parallel_controller_process,
                           run_data_parallel_controller_with_standins,
                           targets.data_parallel_controller_params, False)
    if targets.engine_entries_on_class:
        _swap_class_entry(engine.Engine, "run_scheduler_process_func", scheduler.run_scheduler_process, scheduler_fn)
        _swap_class_entry(engine.Engine, "run_detokenizer_process_func", detokenizer_manager.run_detokenizer_process,
                          run_detokenizer_process_with_standins)


def remove_process_entries() -> None:
    from sglang.srt.managers import detokenizer_manager, scheduler

    from egpo.rollout.engine_options import ENV_VAR

    os.environ.pop(ENV_VAR, None)  # sglang 0.5.12's plugin acts only while it is set
    set_engine_entries(scheduler.run_scheduler_process, detokenizer_manager.run_detokenizer_process)
    import sglang.srt.entrypoints.engine as engine

    if engine.__dict__.get("run_data_parallel_controller_process") is run_data_parallel_controller_with_standins:
        from sglang.srt.managers import data_parallel_controller

        engine.run_data_parallel_controller_process = data_parallel_controller.run_data_parallel_controller_process
