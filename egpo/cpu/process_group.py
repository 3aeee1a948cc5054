"""The process group verl would create on a CPU: ``gloo`` only.

verl asks for ``cpu:gloo,{device}:{backend}``, which torch refuses as a duplicate device type when the device is
the CPU; both verl versions skip their own init when a group exists, so egpo's CPU workers create this one first.
"""

from __future__ import annotations

import datetime
import os

import torch.distributed


def init_gloo_process_group(timeout_s: int = 600) -> None:
    """No-op if a process group exists."""
    if torch.distributed.is_initialized():
        return
    torch.distributed.init_process_group(
        backend="gloo",
        rank=int(os.environ.get("RANK", 0)),
        world_size=int(os.environ.get("WORLD_SIZE", 1)),
        timeout=datetime.timedelta(seconds=timeout_s),
        init_method=os.environ.get("DIST_INIT_METHOD", None),
    )
