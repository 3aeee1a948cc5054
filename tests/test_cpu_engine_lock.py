"""The tests' one-engine-at-a-time lock (tests/cpu_engine_lock.py): another process cannot take it while it is held,
can once it is released or its holder is gone, and a nested hold in one process does not wait on itself."""

import subprocess
import sys
import textwrap
from pathlib import Path

from cpu_engine_lock import LOCK_FILE, one_engine_at_a_time

TRY_LOCK = textwrap.dedent(f"""
    import fcntl, sys
    with open({str(LOCK_FILE)!r}, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            sys.exit(3)
""")


def other_process_gets_it() -> bool:
    done = subprocess.run([sys.executable, "-c", TRY_LOCK], timeout=60)
    assert done.returncode in (0, 3), done
    return done.returncode == 0


def test_held_excludes_another_process_and_nests_in_its_own():
    with one_engine_at_a_time():
        assert not other_process_gets_it()
        with one_engine_at_a_time():  # a fixture's engine and a test's inside it: no wait on itself
            assert not other_process_gets_it()
        assert not other_process_gets_it()  # the outer hold still stands after the inner one ends


def test_a_killed_holder_leaves_it_free():
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from cpu_engine_lock import one_engine_at_a_time
        with one_engine_at_a_time():
            print("held", flush=True)
            time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not other_process_gets_it()
    finally:
        holder.kill()
        holder.wait(timeout=60)
    with one_engine_at_a_time():  # free again: this returns (a leaked lock would hang here)
        pass
