"""sglang's real ``Engine`` on the CPU, with egpo's patches installed the way ``EntropySGLangHttpServer`` installs
them, and an independent float64 reference (Hugging Face forward, plain log-softmax math).

The scheduler runs in its own process; :func:`run_scheduler_with_state_probe` (a test-only entry around egpo's)
adds what the tests ask of it to sglang's ``get_internal_state`` reply: live requests still holding entropy,
and how many requests were retracted.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

from sglang_required import require_sglang
from sglang_engine_lifecycle import started_engine

# egpo's process entries first: they install the CPU stand-ins before anything imports sglang
from egpo.rollout.sglang.process_entries import (
    install_process_entries,
    run_detokenizer_process_with_standins,
    scheduler_entry,
    set_engine_entries,
)

LIVE_KEY = "egpo_live_reqs_holding_entropy"
RETRACTED_KEY = "egpo_retracted_reqs"

ENGINE_ARGS = dict(device="cpu", attention_backend="torch_native", disable_cuda_graph=True, dtype="float32",
                   tp_size=1, mem_fraction_static=0.05, random_seed=0, skip_tokenizer_init=True, log_level="error")


def run_scheduler_with_state_probe(*args, **kwargs):
    """Runs in the spawned scheduler process: egpo's entry, plus the state probe."""
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler

    from egpo.rollout.sglang.scheduler_patches import REQ_VALUES

    retracted = [0]
    retract_decode = ScheduleBatch.retract_decode

    def counting_retract_decode(self, *a, **kw):
        out = retract_decode(self, *a, **kw)
        retracted[0] += len(out[0])
        return out

    get_internal_state = Scheduler.get_internal_state

    def probed_internal_state(self, recv_req):
        reply = get_internal_state(self, recv_req)
        gc.collect()
        reply.internal_state[LIVE_KEY] = sum(
            1 for obj in gc.get_objects() if isinstance(obj, Req) and getattr(obj, REQ_VALUES, None)
        )
        reply.internal_state[RETRACTED_KEY] = retracted[0]
        return reply

    ScheduleBatch.retract_decode = counting_retract_decode
    Scheduler.get_internal_state = probed_internal_state
    return scheduler_entry()(*args, **kwargs)


def run_plain_scheduler(*args, **kwargs):
    """Runs in the spawned scheduler process of an unpatched engine: sglang's own entry (importing this module
    installed the CPU stand-ins every sglang process needs here)."""
    from sglang.srt.managers.scheduler import run_scheduler_process

    from egpo.rollout.sglang.standins import unpin_host_tensors
    from egpo.rollout.sglang.versions import sglang_targets

    if sglang_targets().patches_via_plugin:  # the CPU stand-ins of sglang 0.5.12's scheduler (egpo's entry has them)
        unpin_host_tensors()
    return run_scheduler_process(*args, **kwargs)


@contextmanager
def sglang_engine(model_dir, options=None, *, patched: bool = True, **engine_args):
    """A real ``sglang.Engine`` (patched: egpo's process entries + tokenizer patches, plus the state probe)."""
    require_sglang()
    from egpo.rollout.entropy import EntropyOptions
    from egpo.patching import remove_all
    from egpo.rollout.sglang.tokenizer_patches import PATCHES, apply_tokenizer_patches

    if patched:
        install_process_entries(options or EntropyOptions())
        apply_tokenizer_patches()
        set_engine_entries(run_scheduler_with_state_probe, run_detokenizer_process_with_standins)
    else:
        set_engine_entries(run_plain_scheduler, run_detokenizer_process_with_standins)
    try:
        from egpo.rollout.sglang.versions import sglang_targets

        args = {**ENGINE_ARGS, **dict(sglang_targets().cpu_engine_args), **engine_args}
        with started_engine(model_dir, args) as engine:
            yield engine
    finally:
        if patched:
            remove_all(PATCHES)


def scheduler_state(engine) -> dict:
    return engine.get_server_info()["internal_states"][0]


from hf_reference import load_reference_model, reference  # noqa: E402,F401  (the tests import them from here)
