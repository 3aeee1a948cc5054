"""The driver's console around verl's task runner: every line the runner and its workers print reaches the console
before the command's closing lines, which end it.

The runner (egpo's, in its own Ray actor process) ends each of its two streams with a mark
(:func:`end_runner_output`); Ray forwards each stream in order, so once the driver has read both marks every line the
runner printed has arrived. :class:`RunnerConsole`, around the driver's call into verl, reads the marks off the
console (they never show), optionally copies the console to a log file and leaves out lines that say nothing of the
command (a generation run's trainer-schedule lines), waits for both marks, shuts down the Ray it connected to (Ray's
driver holds back lines its deduplication window keeps until then), and prints the closing lines last.
"""

from __future__ import annotations

import sys
import threading
import time

# the runner's last line on each of its two streams, read and kept off the console by the driver
END_MARK = "[egpo-runner-output-ends]"
STREAMS = ("stdout", "stderr")
SUMMARY_WAIT_S = 30  # the longest the driver waits for the runner's last lines before its closing lines


def end_runner_output(seconds: float) -> None:
    """In the task-runner process, when verl's ``run`` returned: a last line on each stream, the seconds it took."""
    sys.stderr.flush()
    print(f"{END_MARK} stderr", file=sys.stderr, flush=True)
    print(f"{END_MARK} stdout {seconds:.3f}", flush=True)


class RunnerEnd:
    """What the driver has read of the runner's end: which streams ended, and the seconds its run took."""

    def __init__(self):
        self.ended: set[str] = set()
        self.seconds: float | None = None
        self.all_ended = threading.Event()

    def read(self, line: str) -> None:
        words = line[line.index(END_MARK) + len(END_MARK):].split()
        if words and words[0] in STREAMS:
            self.ended.add(words[0])
            if len(words) > 1:
                self.seconds = float(words[1])
        if self.ended == set(STREAMS):
            self.all_ended.set()


# verl's lines that the console shows as one short line (the log keeps them whole): (the line's start, its stand-in)
SHORTENED = (("ray init kwargs: ", "[egpo] ray.init's arguments: ray_kwargs.ray_init in the run's configuration"),)


class Tee:
    """A console stream that reads the runner's end marks off it, leaves out the lines that hold one of ``dropped``,
    shows the lines :data:`SHORTENED` names as their stand-in, and copies the rest (and those lines whole) to ``log``
    (a file, or None)."""

    def __init__(self, stream, log, end: RunnerEnd, dropped: tuple[str, ...] = ()):
        self.stream, self.log, self.end, self.dropped = stream, log, end, dropped
        self._drop_newline = False  # print() writes a line's text and its newline in two calls

    def write(self, text):
        written = len(text)
        if self._drop_newline:
            self._drop_newline = False
            text = text[1:] if text.startswith("\n") else text
        if END_MARK in text or any(d in text for d in self.dropped) or any(s in text for s, _ in SHORTENED):
            kept, shown = [], []
            for line in text.splitlines(keepends=True):
                stand_in = next((short for start, short in SHORTENED if line.startswith(start)), None)
                if END_MARK in line:
                    self.end.read(line)
                    self._drop_newline = not line.endswith("\n")
                elif any(d in line for d in self.dropped):
                    self._drop_newline = not line.endswith("\n")
                elif stand_in is not None:
                    kept.append(line)
                    shown.append(stand_in + ("\n" if line.endswith("\n") else ""))
                else:
                    kept.append(line)
                    shown.append(line)
            if kept:
                self._to_log("".join(kept))
            if shown:
                self.stream.write("".join(shown))
            return written
        if text:
            self._to_log(text)
            self.stream.write(text)
        return written

    def _to_log(self, text):
        """A write that began before the attempt closed its log (Ray's log thread forwards the workers' lines at
        any time) still reaches the console; the log has ended, and takes nothing more."""
        if self.log is None:
            return
        try:
            self.log.write(text)
        except ValueError:  # I/O operation on closed file
            pass

    def flush(self):
        if self.log is not None:
            try:
                self.log.flush()
            except ValueError:
                pass
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


class RunnerConsole:
    """``with RunnerConsole(closing) as console: <verl's run>``: on a clean exit, once the runner's last lines have
    come through, ``closing(seconds)``'s lines are printed last (``seconds``: the runner's run, as it measured it)."""

    def __init__(self, closing=None, log=None, dropped: tuple[str, ...] = ()):
        self.closing, self.log, self.dropped = closing, log, dropped
        self.end = RunnerEnd()
        self._streams = None
        self._started: float | None = None
        self._ray_before = False  # whether this process was connected to Ray before the attempt

    def __enter__(self):
        import ray

        self._ray_before = ray.is_initialized()
        self._streams = sys.stdout, sys.stderr
        sys.stdout = Tee(sys.stdout, self.log, self.end, self.dropped)
        sys.stderr = Tee(sys.stderr, self.log, self.end, self.dropped)
        self._started = time.monotonic()
        return self

    def __exit__(self, kind, error, trace):
        try:
            if kind is None:  # Ray forwards the runner's last lines after its run returned
                self.end.all_ended.wait(timeout=SUMMARY_WAIT_S)
                self._release_held_worker_lines()
                seconds = self.end.seconds if self.end.seconds is not None else time.monotonic() - self._started
                for line in (self.closing(seconds) if self.closing else []):
                    print(line, flush=True)
        finally:
            sys.stdout, sys.stderr = self._streams
        return False

    def _release_held_worker_lines(self) -> None:
        """Ray's driver holds back a worker's line that another worker printed too (digits aside) within its
        deduplication window, until the next forwarded batch or its shutdown, and the process's exit would shut it
        down after the closing lines. Once the runner's last lines came through the run is over: the Ray this
        command connected to is shut down here, and those lines come before the closing ones."""
        import ray

        if ray.is_initialized() and not self._ray_before:
            ray.shutdown()


def duration(seconds: float) -> str:
    """A time on the console: ``1h02m``, ``3m05s``, ``7s`` (a generation's and an ablation's progress lines)."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
