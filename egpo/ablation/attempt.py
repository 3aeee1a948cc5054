"""One attempt of one ablation run: ``python -m egpo.main`` from the run's last checkpoint, its metrics continued.

The same code runs an attempt in the ablation's own process (local runs) and as a Ray job's entrypoint on whichever
node the cluster picks (``python -m egpo.ablation.attempt RUN_DIR``): everything it needs is in the run directory's
``run.json``, written by the ablation before the attempt (:func:`write_run`), on storage every node sees.

    python -m egpo.ablation.attempt DIR/<arm>__seed<k>

Its exit status is the training's (non-zero: the attempt failed, and the run resumes from its last checkpoint).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from egpo.ablation.arms import ARMS, run_name, seed_overrides
from egpo.process_tree import kill_tree
from egpo.runs.state import (ATTEMPT_METRICS, CHECKPOINTS, FAILED, LOG, RUN, TRAINING_STEP_KEY, begin_attempt,
                             end_attempt, installed_versions, logged_steps, record_attempt, run_nodes, validation_owed)



def run_command(work: Path, config_path: str, config_name: str, arm: str, seed: int, steps: int,
                overrides: list[str], demo: Path | None, save_every: int, keep: int,
                python: str = sys.executable) -> list[str]:
    """The run's ``python -m egpo.main`` command: the arm's and the seed's overrides, the checkpointing that makes it
    resumable, then the ablation's overrides (``overrides``: the user's, after any the dispatch adds)."""
    args = [*ARMS[arm], *seed_overrides(seed), f"trainer.total_training_steps={steps}", "trainer.logger=[console,file]",
            f"trainer.experiment_name={run_name(arm, seed)}",
            f"trainer.default_local_dir={override_value(work / CHECKPOINTS)}",
            f"trainer.save_freq={save_every}", "trainer.resume_mode=auto", f"trainer.max_actor_ckpt_to_keep={keep}",
            f"trainer.max_critic_ckpt_to_keep={keep}", f"hydra.run.dir={override_value(work / 'hydra')}",
            # verl's file logger runs in a Ray worker: its path travels in the runtime env, which reaches the workers
            # of a Ray the run starts and of a cluster it joins alike
            "++ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH=" + override_value(work / ATTEMPT_METRICS),
            *([f"egpo_demo.out={override_value(demo)}"] if demo else []), *overrides]
    return [python, "-m", "egpo.main", f"--config-path={Path(config_path).resolve()}",
            f"--config-name={config_name}", *args]


def override_value(path: Path) -> str:
    """A path as a Hydra override's value: quoted where Hydra would read its characters as syntax."""
    text = str(path)
    if re.fullmatch(r"[\w/.\-]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def write_run(work: Path, arm: str, seed: int, steps: int, command: list[str], keep: int, timeout: int,
              stall_timeout: int = 0, recipe: str | None = None, overrides: list[str] = (),
              start_timeout: int | None = None) -> None:
    """``run.json``: what an attempt runs, where (the ablation's working directory, so relative paths mean the same
    in every run as on its command line), for how long, and how long without a step before it counts as stalled
    (``start_timeout``: before its first training step; None: twice ``stall_timeout``); and, for the report, the
    recipe, the arm's and the ablation's overrides and the installed versions."""
    work.mkdir(parents=True, exist_ok=True)
    (work / RUN).write_text(json.dumps({"arm": arm, "seed": seed, "steps": steps, "command": command,
                                        "cwd": os.getcwd(), "keep": keep, "timeout": timeout,
                                        "stall_timeout": stall_timeout, "start_timeout": start_timeout,
                                        "recipe": recipe,
                                        "arm_overrides": list(ARMS.get(arm, ())), "overrides": list(overrides),
                                        "versions": installed_versions()}, indent=1))


NO_REVALIDATION = "trainer.val_before_train=false"


REVALIDATION = "trainer.val_before_train=true"


def attempt_command(command: list[str], resume: int, validation_owed: bool = False) -> list[str]:
    """The run's command for an attempt that resumes from step ``resume``: a resumed attempt does not validate before
    training (the step it resumes from was validated, where it was due, by the attempt that reached it; verl would
    validate all over again at that step, a full validation's generations per resume), unless the attempt that
    reached it stopped during that validation (``validation_owed``: :func:`egpo.runs.state.validation_owed`)."""
    if resume <= 0:
        return list(command)
    return [*command, REVALIDATION if validation_owed else NO_REVALIDATION]


FAST_FAILURE_LIMIT = 3  # failures in a row that logged no step: the ablation starts no more runs


def last_step(work: Path) -> int:
    """The run's last logged step (0: none yet)."""
    steps = logged_steps(work)
    return steps[-1]["step"] if steps else 0


def stalled(work: Path) -> bool:
    """Whether the run's last failed attempt was stopped by its watch as stalled (``failed.json``)."""
    try:
        return str(json.loads((work / FAILED).read_text()).get("ended", "")).startswith("stalled")
    except (OSError, ValueError):
        return False


def log_tail(work: Path, lines: int = 20) -> str:
    log = work / LOG
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


class Stopped(Exception):
    """The attempt was told to stop (SIGTERM: Ray stopping its job)."""


class Ended(Exception):
    """The attempt was ended by its watch: its timeout, or no step logged for too long."""


STALL_FACTOR = 5  # a run is stalled after this many times its slowest step (at least spec["stall_timeout"])
STALL_BASE_S = 1800  # the stall allowance of a recipe whose responses are up to STALL_BASE_TOKENS long
STALL_BASE_TOKENS = 4096


def default_stall_timeout(config) -> int:
    """The seconds without a logged step after which an attempt counts as stalled, from the recipe: 30 minutes for
    responses up to 4K tokens, in proportion beyond (2 hours at 16K): a step's longest response sets its time."""
    response = int(config.data.get("max_response_length", STALL_BASE_TOKENS) or STALL_BASE_TOKENS)
    return int(STALL_BASE_S * max(1.0, response / STALL_BASE_TOKENS))


class Watch:
    """When an attempt must end although its training runs on: after ``timeout`` seconds in all, or when nothing was
    logged for the step's allowance. A training step is a logged line with verl's step timing (the validation before
    training logs a line at step 0 without it). Before the first training step the allowance is ``start_timeout``
    (None: twice ``stall_timeout``: the start, a model's load, an engine's), and at least twice the validation's time
    where one was logged (a whole validation's generations: the first step's generations and update take the same
    order of time); after it, ``max(stall_timeout, STALL_FACTOR x the slowest training step so far)``."""

    def __init__(self, metrics: Path, timeout: float | None, stall_timeout: float | None, on_line=None,
                 start_timeout: float | None = None):
        self.metrics, self.timeout, self.stall_timeout, self.on_line = metrics, timeout, stall_timeout, on_line
        self.start_timeout = start_timeout or (2 * stall_timeout if stall_timeout else None)
        self.start = self.last = time.time()
        self.offset, self.slowest, self.steps, self.validation = 0, 0.0, 0, 0.0
        self.partial = b""

    def _new_lines(self) -> list[dict]:
        """The lines logged since the last look (a line still being written waits for its end)."""
        try:
            with open(self.metrics, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        lines = []
        for raw in complete:
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict):
                lines.append(line)
        return lines

    def check(self) -> str | None:
        """Why the attempt must end now (None: it goes on)."""
        now = time.time()
        for line in self._new_lines():
            if self.on_line is not None:
                self.on_line(line, now)
            if TRAINING_STEP_KEY in (line.get("data") or {}):
                if self.steps:
                    self.slowest = max(self.slowest, now - self.last)
                self.steps += 1
            elif not self.steps:
                self.validation = max(self.validation, now - self.start)
            self.last = now
        if self.timeout and now - self.start > self.timeout:
            return f"stopped after its timeout of {self.timeout:g} s"
        if self.stall_timeout:
            if self.steps:
                allowed = max(self.stall_timeout, STALL_FACTOR * self.slowest)
            else:
                allowed = max(self.start_timeout, 2 * self.validation)
            if now - self.last > allowed:
                what = f"nothing logged for {now - self.last:.0f} s (allowed {allowed:.0f} s" + (
                    f"; its slowest training step took {self.slowest:.0f} s)" if self.slowest else
                    "; one training step so far, none timed yet)" if self.steps else "; no training step yet)")
                return f"stalled: {what}; stopped, to be resumed from its last checkpoint"
        return None


def wait(proc: subprocess.Popen, watch: Watch, every: float = 1.0) -> int:
    """The training's exit status, or :class:`Ended` where the watch ends it first."""
    while True:
        try:
            return proc.wait(timeout=every)
        except subprocess.TimeoutExpired:
            reason = watch.check()
            if reason:
                raise Ended(reason) from None


def run_attempt(work: Path, own_session: bool, echo: bool = False, on_line=None) -> dict:
    """One attempt, from the run's last checkpoint; returns ``{"returncode", "seconds", "resumed_from", "host",
    "nodes"}`` (``host``: where the attempt ran, the head on a cluster; ``nodes``: where the run placed its GPU
    workers, empty where it failed before placing them), and ``"ended"``: why its watch stopped it, where it did.

    ``own_session``: the training gets a process session of its own, and stopping the attempt (its timeout, a stall,
    Ctrl-C) kills that session, with every process the training started (a local Ray's among them). A Ray job's
    entrypoint leaves the training in the job's own session, which Ray signals when it stops the job. ``echo``: the
    training's output goes to this process's stdout as well as to the run's log (a Ray job's log). ``on_line(line,
    when)``: called with each metrics line the attempt logs, as the watch reads it (the ablation's progress lines).
    """
    spec = json.loads((work / RUN).read_text())
    cwd = Path(spec["cwd"])
    if not cwd.is_dir():
        raise SystemExit(f"[ablation] {cwd}, the directory the ablation was started in, is not on "
                         f"{socket.gethostname()}: start the ablation from storage every node mounts at the same path")
    resume, metrics = begin_attempt(work)  # the attempt's metrics file is named in its command (run_command)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start, host = time.time(), socket.gethostname()

    def result(returncode: int, **extra) -> dict:
        return {"returncode": returncode, "seconds": round(time.time() - start, 1), "resumed_from": resume,
                "host": host, "nodes": run_nodes(work), **extra}

    with open(work / LOG, "a") as log:
        log.write(f"[ablation] attempt from step {resume} on {host}\n")
        log.flush()
        owed = validation_owed(work / CHECKPOINTS, resume)
        if owed:
            log.write(f"[ablation] step {resume}'s validation was cut short by the last attempt: it runs first\n")
            log.flush()
        proc = subprocess.Popen(attempt_command(spec["command"], resume, owed), cwd=cwd,
                                stdout=subprocess.PIPE if echo else log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=own_session)
        record_attempt(work, proc.pid, resume)
        pump = _echo(proc, log) if echo else None
        watch = Watch(metrics, spec.get("timeout") or None, spec.get("stall_timeout") or None, on_line,
                      spec.get("start_timeout") or None)
        try:
            returncode = wait(proc, watch)
        except BaseException as err:  # the watch, Ctrl-C, the job stopped: the training stops with the attempt
            _stop(proc, own_session)
            returncode = -signal.SIGKILL if isinstance(err, Ended) else -signal.SIGTERM
            if pump is not None:
                pump.join(timeout=10)
            if isinstance(err, Ended):
                log.write(f"[ablation] attempt {err}\n")
                ended = result(returncode, ended=str(err))
                end_attempt(work, ended, spec["keep"])
                return ended
            end_attempt(work, result(returncode), spec["keep"])
            raise
        if pump is not None:
            pump.join(timeout=30)  # a process the training left behind may hold its output open
    done = result(returncode)
    end_attempt(work, done, spec["keep"])
    return done


def _echo(proc: subprocess.Popen, log) -> threading.Thread:
    def pump():
        for line in iter(proc.stdout.readline, b""):
            log.write(line.decode(errors="replace"))
            log.flush()
            sys.stdout.write(line.decode(errors="replace"))
            sys.stdout.flush()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def _stop(proc: subprocess.Popen, own_session: bool) -> None:
    try:
        if own_session:
            kill_tree(proc.pid)  # the driver's group and Ray's workers below it, each in a group of its own
        else:  # the job's session already had Ray's SIGTERM; what is left of the training ends now
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()


def _raise_stopped(signum, frame):
    raise Stopped(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m egpo.ablation.attempt RUN_DIR")
    work = Path(argv[0])
    if not (work / RUN).exists():
        raise SystemExit(f"[ablation] {work / RUN} is not on {socket.gethostname()}: the ablation's --out must be on "
                         "storage every node mounts at the same path")
    signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        result = run_attempt(work, own_session=False, echo=True)
    except Stopped:
        print(f"[ablation] {work.name}: stopped", flush=True)
        raise SystemExit(143) from None
    print(f"[ablation] {work.name}: attempt ended with status {result['returncode']} after {result['seconds']} s "
          f"(from step {result['resumed_from']})", flush=True)
    raise SystemExit(0 if result["returncode"] == 0 else 1)


if __name__ == "__main__":
    main()
