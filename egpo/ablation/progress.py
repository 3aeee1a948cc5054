"""Where an ablation is while a run trains or a generation samples: a line now and then, read from what the run
already writes (its metrics lines, generate's own progress lines), so the console never stands still for long.

A training run's line (:class:`StepProgress`) comes at each tenth of its steps, and at least every
:data:`AT_LEAST_EVERY_S` while steps are logged: ``[ablation] 1/4 grpo__seed0: step 9/30, 3.9 s/step, 1m22s left``.
The seconds per step are this attempt's, from its first training step on (the first step's own time holds the model's
load and the validation before training, said on a line of its own).
"""

from __future__ import annotations

import re
import time

from egpo.runner_console import duration
from egpo.runs.state import TRAINING_STEP_KEY

AT_LEAST_EVERY_S = 300.0
GENERATE_LINE = re.compile(r"\[egpo\] (?:generate|score) (\[[#-]+\] .*)$")


class StepProgress:
    """``progress(line, now)`` for each metrics line an attempt logs; prints where the run is."""

    def __init__(self, label: str, total_steps: int, started: float | None = None, echo=print,
                 every_s: float = AT_LEAST_EVERY_S):
        self.label, self.total, self.echo, self.every_s = label, total_steps, echo, every_s
        self.started = time.time() if started is None else started
        self.share = max(1, total_steps // 10)
        self.first: tuple[int, float] | None = None  # (step, when) of this attempt's first training step
        self.said: tuple[int, float] | None = None  # (step, when) of the last line printed

    def __call__(self, line: dict, now: float) -> None:
        step, data = line.get("step"), line.get("data") or {}
        if not isinstance(step, int):
            return
        if TRAINING_STEP_KEY not in data:
            if self.first is None and any(key.startswith("val-") for key in data):
                self.echo(f"{self.label}: validation before training done, {now - self.started:.0f} s after the "
                          "start", flush=True)
            return
        if self.first is None:
            self.first = (step, now)
        due = self.said is None or step - self.said[0] >= self.share or now - self.said[1] >= self.every_s
        if due or step >= self.total:
            self.said = (step, now)
            self.echo(self.line(step, now), flush=True)

    def line(self, step: int, now: float) -> str:
        first_step, first_at = self.first
        if step > first_step:
            per_step = (now - first_at) / (step - first_step)
            pace = f", {per_step:.1f} s/step, {duration(per_step * max(0, self.total - step))} left"
        else:
            pace = f", {now - self.started:.0f} s for the load, the first validation and this step"
        return f"{self.label}: step {step}/{self.total}{pace}"


def generation_progress(line: str) -> str | None:
    """generate's own progress bar in one of its output lines (Ray's process prefix dropped), or None."""
    found = GENERATE_LINE.search(line.rstrip("\n"))
    return found.group(1) if found else None
