"""What verl's sglang rollout needs from a CPU trainer worker.

**Device slot.** verl's ``SGLangReplica.launch_servers`` reads each trainer worker's ``CUDA_VISIBLE_DEVICES``
(Ray sets it only for actors holding a GPU) to tell the sglang server which devices it shares with them. A
CPU worker declares its local rank there; sglang's CPU engine (``device=cpu``) does not use it.

**sglang's CPU switch.** verl's adapter builds an sglang ``ServerArgs`` for its HTTP client without a device;
sglang then asks ``get_device()``, which raises without an accelerator unless sglang's own CPU switch
``SGLANG_USE_CPU_ENGINE=1`` is set. It is set in the trainer worker only (the engine itself gets
``device=cpu`` from ``rollout.engine_kwargs.sglang``).

**Weight sync.**
verl's ``ServerAdapter.update_weights`` (the hybrid engine's push, every step) serializes each weight with
sglang's ``MultiprocessingSerializer`` (torch's multiprocessing pickler) and posts it to the sglang server,
whose scheduler process rebuilds the tensor. On a GPU that is a CUDA IPC handle. A CPU tensor is shared by
default as a file descriptor handed over a connection authenticated with the *sending* process's key, which
sglang's scheduler (an unrelated process) does not have: it fails with ``AuthenticationError``. Sharing CPU
tensors by shared-memory file name (torch's ``file_system`` strategy) lets any process on the machine map them;
the trainer keeps each tensor alive until the server has loaded it (the post is awaited).

**The shared-memory manager's one second.** Under ``file_system`` each tensor's segment is registered with torch's
``torch_shm_manager``, a process of its own, and torch gives its answer one second (``libshm``'s ``recv``) before it
raises "Shared memory manager connection has timed out". On a CPU whose cores a whole run shares (two ranks, the
engine's schedulers, Ray), the manager has missed that second at a step's push. The failed registration leaves the
tensor as it was, so egpo registers it again (:data:`SHARE_RETRIES` times, each after a pause twice the last's);
the manager removes every segment when the run's processes end.

**torch's reducers.** Before serializing, sglang's ``monkey_patch_torch_reductions`` replaces torch's tensor
reducer by one that rewrites argument 6 of every reduced tensor (a CUDA device index, made a device UUID for
CUDA IPC). A CPU tensor's reduced arguments have no such slot: it fails with ``IndexError``. sglang skips its
patch when ``reductions._reduce_tensor_original`` exists; on a CPU worker egpo sets it to torch's own reducer,
so CPU tensors keep torch's reduction (there are no CUDA tensors to fix up).
"""

from __future__ import annotations

import os

import torch.multiprocessing

SHARING_STRATEGY = "file_system"
SHARE_RETRIES = 6  # registrations of a segment after the first timed out (pauses 0.1 s, doubling: 6.3 s in all)
SHARE_TIMEOUT = "Shared memory manager connection has timed out"  # libshm's message for its one second


def _share_filename_again(original, storage, *args, **kwargs):
    """torch's ``UntypedStorage._share_filename_cpu_``, registered again where torch's shared-memory manager did not
    answer within its second (the module's docstring); any other error, or the last timeout, is raised."""
    import time

    pause = 0.1
    for attempt in range(SHARE_RETRIES + 1):
        try:
            return original(storage, *args, **kwargs)
        except RuntimeError as err:
            if SHARE_TIMEOUT not in str(err) or attempt == SHARE_RETRIES:
                raise
            time.sleep(pause)
            pause *= 2


def share_filename_patch():
    from egpo.patching import Patch

    return Patch("torch.storage:UntypedStorage._share_filename_cpu_", _share_filename_again)


DEVICE_SLOT_VAR = "CUDA_VISIBLE_DEVICES"
SGLANG_CPU_SWITCH = {"SGLANG_USE_CPU_ENGINE": "1"}


def prepare_worker_for_sglang() -> None:
    """In the CPU trainer worker, before verl builds its sglang rollout adapter (idempotent)."""
    from verl.utils.device import get_visible_devices_keyword

    from egpo.rollout.sglang.standins import prepare_sglang_import

    if get_visible_devices_keyword() != DEVICE_SLOT_VAR:
        raise RuntimeError(f"verl reads {get_visible_devices_keyword()} for sglang's devices, egpo's CPU worker sets {DEVICE_SLOT_VAR}")
    os.environ.setdefault(DEVICE_SLOT_VAR, os.environ.get("LOCAL_RANK", "0"))
    os.environ.update(SGLANG_CPU_SWITCH)
    if SHARING_STRATEGY not in torch.multiprocessing.get_all_sharing_strategies():
        raise RuntimeError(f"torch has no {SHARING_STRATEGY!r} sharing strategy; the sglang rollout cannot take weights on CPU")
    torch.multiprocessing.set_sharing_strategy(SHARING_STRATEGY)
    share_filename_patch().apply()
    prepare_sglang_import()
    keep_torch_tensor_reducer()


def keep_torch_tensor_reducer() -> None:
    """Make sglang's CUDA-only ``monkey_patch_torch_reductions`` a no-op in this (CPU) process; guarded."""
    import inspect

    from sglang.srt.utils import patch_torch
    from torch.multiprocessing import reductions

    if 'hasattr(reductions, "_reduce_tensor_original")' not in inspect.getsource(patch_torch.monkey_patch_torch_reductions):
        raise RuntimeError(
            "sglang.srt.utils.patch_torch.monkey_patch_torch_reductions no longer skips itself when "
            "torch.multiprocessing.reductions._reduce_tensor_original exists (sglang 0.5.6.post2 and 0.5.12 do); egpo "
            "cannot keep torch's CPU tensor reducer. Install the sglang egpo.rollout.sglang.versions lists for your verl."
        )
    if not hasattr(reductions, "_reduce_tensor_original"):
        reductions._reduce_tensor_original = reductions.reduce_tensor
