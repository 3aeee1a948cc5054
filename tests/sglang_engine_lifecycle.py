"""A real ``sglang.Engine`` started and stopped the one way every engine test needs: under the machine-wide engine lock,
egpo's process entries removed once the engine's processes have started (whether or not the start succeeded), and
sglang's SIGQUIT handler (a child's failure kills the whole process tree) restored after the shutdown or a failed
start.

Imports neither conftest nor verl: the observer's engine lanes run ``--noconftest`` in environments without verl.
"""

from __future__ import annotations

import signal
from contextlib import contextmanager

from cpu_engine_lock import one_engine_at_a_time


@contextmanager
def started_engine(model_dir, engine_args: dict):
    """Yields ``sglang.Engine(model_path=model_dir, **engine_args)``; the caller installs egpo's process entries
    (or not) before entering."""
    import sglang

    from egpo.rollout.sglang.process_entries import remove_process_entries

    sigquit = signal.getsignal(signal.SIGQUIT)
    try:
        with one_engine_at_a_time():
            try:
                engine = sglang.Engine(model_path=str(model_dir), **engine_args)
            finally:
                remove_process_entries()
            try:
                yield engine
            finally:
                engine.shutdown()
    finally:
        signal.signal(signal.SIGQUIT, sigquit)
