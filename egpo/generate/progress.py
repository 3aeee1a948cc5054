"""A generation run's progress line: rows written of all, generated tokens per second, time left.

One line per part (a run's stdout travels through Ray's log forwarding, where a redrawn terminal bar would arrive as
one line per redraw): ``[egpo] generate [#####-----] 96/320 samples, 1,234 tok/s, 2m10s left``.
"""

from __future__ import annotations

import time

from egpo.runner_console import duration

WIDTH = 20


class Progress:
    def __init__(self, what: str, total_rows: int | None, unit_rows: str = "rows", echo=print):
        self.what, self.total, self.unit, self.echo = what, total_rows, unit_rows, echo
        self.done = 0  # rows written, this attempt's and earlier attempts'
        self.rows = 0  # this attempt's
        self.tokens = 0  # this attempt's response tokens
        self.started = time.monotonic()

    def skip(self, rows: int) -> None:
        """Rows an earlier attempt wrote."""
        self.done += rows

    def advance(self, rows: int, tokens: int) -> None:
        self.done += rows
        self.rows += rows
        self.tokens += tokens
        self.echo(self.line(), flush=True)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = f"{self.tokens / elapsed:,.0f} tok/s"
        if not self.total:
            return f"[egpo] {self.what}: {self.done} {self.unit}, {rate}"
        filled = min(WIDTH, int(WIDTH * self.done / self.total))
        left = (self.total - self.done) * elapsed / self.rows if self.rows else float("nan")
        eta = duration(left) + " left" if left == left else "time left unknown"
        return (f"[egpo] {self.what} [{'#' * filled}{'-' * (WIDTH - filled)}] {self.done}/{self.total} {self.unit}, "
                f"{rate}, {eta}")

    def close(self) -> None:
        elapsed = time.monotonic() - self.started
        self.echo(f"[egpo] {self.what}: {self.rows} {self.unit} ({self.tokens:,} response tokens) in "
                  f"{duration(elapsed)} this attempt; {self.done} in all", flush=True)
