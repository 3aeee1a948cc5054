"""One real inference engine (sglang's or vLLM's) at a time on this machine, across every pytest session and worker.

CI's lanes run side by side (.ci/run): an engine lane beside a stack's end-to-end runs, a stack's tests two at a time.
An engine on 2 cores takes both (its scheduler's loop, torch's and OpenMP's threads, spinning); two at once slow each
other far beyond half speed: a 2-step sglang run (about two minutes alone) spent 258 s generating its first step's
32 responses beside another sglang engine's tests and other load, and hit its 600-s timeout (measured 2026-11-27).
A test holds this lock from before its engine starts until after it is shut down; a test that waits for it has not
started its engine, so no timeout of its own runs meanwhile. The lock is a file lock (``flock``): the kernel drops it
when its holder exits, however it exits, so a killed test never leaves it held. Re-entrant within a process (a test's
engine inside a fixture's).
"""

from __future__ import annotations

import fcntl
import tempfile
from contextlib import contextmanager
from pathlib import Path

LOCK_FILE = Path(tempfile.gettempdir()) / "egpo-tests-one-engine.lock"
_depth = [0]  # this process's holds: the outermost takes and releases the file lock


@contextmanager
def one_engine_at_a_time():
    if _depth[0]:
        _depth[0] += 1
        try:
            yield
        finally:
            _depth[0] -= 1
        return
    with open(LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _depth[0] = 1
        try:
            yield
        finally:
            _depth[0] = 0
            fcntl.flock(handle, fcntl.LOCK_UN)
