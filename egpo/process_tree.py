"""Stopping a run whole, as a lost node stops it: the driver, its process group and every process below it, Ray's
workers included (Ray starts each worker in a process group of its own, so a signal to the driver's group alone
leaves the trainer and its workers running until they notice, time enough to log a step the kill meant to lose)."""

from __future__ import annotations

import os
import signal


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``, its process group and all its descendants, listed before the first signal (a killed parent's
    children are no longer found below it)."""
    import psutil

    try:
        root = psutil.Process(pid)
        below = root.children(recursive=True)
    except psutil.NoSuchProcess:
        below = []
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in below:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
