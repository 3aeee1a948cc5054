"""egpo's ``sglang.srt.plugins`` entry point (sglang >= 0.5.12): rollout entropy inside sglang's scheduler
processes, loaded by sglang itself. On sglang 0.5.20 and later it only registers, through sglang's ``HookRegistry``,
the installation of egpo's ``SamplingObserver`` after ``ModelRunner.__init__`` (:mod:`egpo.rollout.sglang.observer`,
sglang's official hook: nothing patched). On 0.5.12:

sglang 0.5.12 calls ``load_plugins()`` first thing in every scheduler process (and in ``Engine.__init__``), which
runs every function registered under the ``sglang.srt.plugins`` entry-point group (``pyproject.toml``). This one
acts only in the spawned processes of an engine egpo launched:
:func:`egpo.rollout.sglang.process_entries.install_process_entries` exports the entropy options
(``EGPO_ROLLOUT_ENTROPY``) before sglang starts its processes, which inherit them; any other sglang user of the
environment, and the launching process itself, are left untouched. It applies the same checked patches as the
0.5.6.post2 path (:mod:`egpo.rollout.sglang.scheduler_patches`; the parent checked every target before launching,
because sglang logs and swallows a plugin's exceptions), and registers with sglang's ``HookRegistry`` a hook before
``configure_scheduler_process`` that compiles the entropy kernel for the model's vocabulary on a GPU before the
scheduler is built.
"""

from __future__ import annotations

import os

from egpo.rollout.engine_options import ENV_VAR

CONFIGURE_TARGET = "sglang.srt.managers.scheduler.configure_scheduler_process"


def load() -> None:
    import multiprocessing

    # sglang's spawned children only (its schedulers); Engine.__init__ in the launching process loads plugins too
    if not os.environ.get(ENV_VAR) or multiprocessing.parent_process() is None:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from egpo.rollout.engine_options import read_options
    from egpo.rollout.sglang.versions import sglang_targets

    options = read_options()
    if sglang_targets().entropy_via_observer:
        from egpo.rollout.sglang.observer import INIT_TARGET, install_observer

        def install_after_init(result, model_runner, *args, **kwargs):
            install_observer(model_runner, options)
            return result

        HookRegistry.register(INIT_TARGET, install_after_init, HookType.AFTER)
        return

    from egpo.rollout.sglang.sampler_patch import warm_sampler_kernel
    from egpo.rollout.sglang.scheduler_patches import apply_scheduler_patches

    apply_scheduler_patches(options)

    def warm_kernel_first(server_args, gpu_id, *args, **kwargs):
        warm_sampler_kernel(server_args, gpu_id, options)

    HookRegistry.register(CONFIGURE_TARGET, warm_kernel_first, HookType.BEFORE)
