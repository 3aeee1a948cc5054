"""A main job's run directory: where ``python -m egpo.main`` puts what a run produces, said at the start and at the
end.

The run directory is verl's ``trainer.default_local_dir`` (``checkpoints/<project_name>/<experiment_name>`` under
the directory the command runs in, unless set): verl's checkpoints (``global_step_N/``) and its resume pointer are
there already, and egpo adds

* ``config.yaml``: the configuration the run started with, after egpo's own settings (verl's console dump of it is
  replaced by one line naming this file: :mod:`egpo.console`);
* ``metrics.jsonl``: verl's file logger, one ``{"step": n, "data": {...}}`` line per step, each step once across
  resumed attempts (verl truncates the file it is given, so each attempt writes ``metrics.attempt.jsonl``, joined
  when it ends or when the next attempt starts; :mod:`egpo.run_state`); ``python -m egpo.report DIR`` reads it;
* ``log.txt``: the console, every attempt appended.

A run started by ``python -m egpo.ablation`` has a run directory of the ablation's (it sets verl's file logger
path itself): nothing here applies to it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from egpo.run_state import CONFIG, LOG

LOGGER_PATH_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"


def run_directory(config: DictConfig) -> Path | None:
    """``trainer.default_local_dir``, resolved; None where verl's file logger writes elsewhere (set by
    ``python -m egpo.ablation``, or by hand)."""
    from egpo.run_state import ATTEMPT_METRICS

    local_dir = OmegaConf.select(config, "trainer.default_local_dir", default=None)
    if local_dir is None:
        return None
    where = Path(str(local_dir)).expanduser().resolve()
    logger_path = OmegaConf.select(config, LOGGER_PATH_KEY, default=None) or os.environ.get("VERL_FILE_LOGGER_PATH")
    if logger_path and Path(str(logger_path)) != where / ATTEMPT_METRICS:
        return None
    return where


def trainer_loggers(config: DictConfig) -> list[str]:
    """``trainer.logger`` as a list (verl takes one name or a list)."""
    loggers = config.trainer.get("logger", ["console"])
    return [loggers] if isinstance(loggers, str) else list(loggers)


def complete_run_outputs(config: DictConfig) -> None:
    """verl's file logger on, writing into the run directory (a preflight step: nothing is written here)."""
    from egpo.run_state import ATTEMPT_METRICS

    where = run_directory(config)
    if where is None:
        return
    loggers = trainer_loggers(config)
    with open_dict(config):
        config.trainer.default_local_dir = str(where)  # the driver's and the workers' run directory alike
        if "file" not in loggers:
            config.trainer.logger = [*loggers, "file"]
        OmegaConf.update(config, LOGGER_PATH_KEY, str(where / ATTEMPT_METRICS), force_add=True)


def resumed_step(config: DictConfig, where: Path) -> int:
    """The step verl will resume from (0: a fresh start), as verl decides it."""
    mode = str(config.trainer.get("resume_mode", "auto"))
    if mode == "disable":
        return 0
    if mode == "resume_path":
        tail = Path(str(config.trainer.get("resume_from_path") or "")).name
        return int(tail.rsplit("_", 1)[1]) if tail.startswith("global_step_") else 0
    from egpo.run_state import checkpoint_pointer

    return checkpoint_pointer(where)


REPORT_LINE = "[egpo] report: python -m egpo.report"  # the closing summary's last line
NO_STEPS_LINE = "[egpo] no step was logged"  # or its only one
# the runner's last line on each of its two streams, read and kept off the console by the driver: every line the
# runner printed before it on that stream has reached the driver (Ray forwards each stream in its order)
END_MARK = "[egpo-runner-output-ends]"
STREAMS = ("stdout", "stderr")
SUMMARY_WAIT_S = 30  # the longest the driver waits for the runner's last lines before its closing summary


class _RunnerEnd:
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


class _Tee:
    """A console stream that also appends to the run's log, and reads the runner's end marks off it."""

    def __init__(self, stream, log, end: _RunnerEnd):
        self.stream, self.log, self.end = stream, log, end
        self._drop_newline = False  # print() writes a line's text and its newline in two calls

    def write(self, text):
        written = len(text)
        if self._drop_newline:
            self._drop_newline = False
            text = text[1:] if text.startswith("\n") else text
        if END_MARK in text:
            kept = []
            for line in text.splitlines(keepends=True):
                if END_MARK in line:
                    self.end.read(line)
                    self._drop_newline = not line.endswith("\n")
                else:
                    kept.append(line)
            text = "".join(kept)
        if text:
            self._to_log(text)
            self.stream.write(text)
        return written

    def _to_log(self, text):
        """A write that began before the attempt closed its log (Ray's log thread forwards the workers' lines at
        any time) still reaches the console; the log has ended, and takes nothing more."""
        try:
            self.log.write(text)
        except ValueError:  # I/O operation on closed file
            pass

    def flush(self):
        try:
            self.log.flush()
        except ValueError:
            pass
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


class RunOutputs:
    """Around one attempt of a main job, in the driver: the run directory prepared and announced, the console copied
    to its log, the attempt's metrics joined at the end and the closing summary printed last, once the runner's
    own last lines have come through (``with RunOutputs(config): run``; the runner marks its end:
    :func:`end_runner_output`)."""

    def __init__(self, config: DictConfig):
        self.config = config
        self.where = run_directory(config)
        self._log = self._streams = None
        self._end = _RunnerEnd()
        self._started: float | None = None  # when the attempt's console began to be copied
        self._ray_before = False  # whether this process was connected to Ray before the attempt

    def __enter__(self):
        if self.where is None:
            return self
        import ray

        from egpo.run_state import METRICS_FILE, continue_metrics

        self._ray_before = ray.is_initialized()
        self.where.mkdir(parents=True, exist_ok=True)
        resume = resumed_step(self.config, self.where)
        continue_metrics(self.where, resume)
        try:
            text = OmegaConf.to_yaml(self.config, resolve=True)
        except Exception:  # noqa: BLE001 - an interpolation only the workers can resolve: kept as written
            text = OmegaConf.to_yaml(self.config)
        (self.where / CONFIG).write_text(text)
        self._log = (self.where / LOG).open("a", buffering=1)
        self._log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")
        self._streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(sys.stdout, self._log, self._end), _Tee(sys.stderr, self._log, self._end)
        self._started = time.monotonic()
        start = f"resumes from step {resume}" if resume else "starts at step 0"
        print(f"[egpo] run directory: {self.where} ({start}; {CONFIG}, {METRICS_FILE}, {LOG}, "
              "checkpoints)", flush=True)
        return self

    def __exit__(self, kind, error, trace):
        if self.where is None:
            return False
        from egpo.run_state import join_attempt_metrics, logged_steps

        join_attempt_metrics(self.where)
        if kind is None:  # Ray forwards the runner's last lines after its run returned
            self._end.all_ended.wait(timeout=SUMMARY_WAIT_S)
            self._release_held_worker_lines()
            seconds = self._end.seconds if self._end.seconds is not None else time.monotonic() - self._started
            for line in summary_lines(self.where, logged_steps(self.where), self.config, seconds):
                print(line, flush=True)
        sys.stdout, sys.stderr = self._streams
        self._log.close()
        return False

    def _release_held_worker_lines(self) -> None:
        """Ray's driver holds back a worker's line that another worker printed too (digits aside) within its
        deduplication window, until the next forwarded batch or its shutdown, and the process's exit would shut it
        down after the closing summary. Once the runner's last lines came through the run is over: the Ray this
        attempt connected to is shut down here, and those lines come before the summary."""
        import ray

        if ray.is_initialized() and not self._ray_before:
            ray.shutdown()


def end_runner_output(config: DictConfig, seconds: float) -> None:
    """At the end of verl's ``run``, in its task-runner process (egpo's runner): a last line on each of its streams,
    which the driver keeps off the console (:class:`RunOutputs`); the driver's closing summary follows it, and so
    follows verl's own last lines (its progress bar's end among them)."""
    if run_directory(config) is None:
        return
    sys.stderr.flush()
    print(f"{END_MARK} stderr", file=sys.stderr, flush=True)
    print(f"{END_MARK} stdout {seconds:.3f}", flush=True)


def _last(steps: list[dict], key: str) -> tuple[int, float] | None:
    for step in reversed(steps):
        value = step.get("data", {}).get(key)
        if isinstance(value, (int, float)):
            return step["step"], float(value)
    return None


def summary_lines(where: Path, steps: list[dict], config: DictConfig, seconds: float) -> list[str]:
    """What a finished attempt says last: the steps, the latest reward and CoT entropy, the last validation's pass@k,
    where everything is, and the command that reports the run."""
    from egpo.run_state import METRICS_FILE

    if not steps:
        return [f"{NO_STEPS_LINE}; the run directory: {where}"]
    last = steps[-1]["step"]
    figures = []
    for key, name in (("critic/score/mean", "reward"), ("egpo/cot_entropy_mean", "CoT entropy")):
        found = _last(steps, key)
        if found:
            figures.append(f"{name} {found[1]:.4g}" + (f" (step {found[0]})" if found[0] != last else ""))
    validation = next((s for s in reversed(steps) if any(k.startswith("val-egpo/pass@") for k in s["data"])), None)
    val = ""
    if validation is not None:
        passes = sorted((int(k.split("@")[1]), k) for k in validation["data"] if k.startswith("val-egpo/pass@"))
        val = f"validation at step {validation['step']}: " + ", ".join(
            f"pass@{k} {validation['data'][key]:.4g}" for k, key in dict.fromkeys([passes[0], passes[-1]]))
    save_freq = int(config.trainer.get("save_freq", -1) or -1)
    checkpoints = sorted(where.glob("global_step_*"))
    kept = (f"{len(checkpoints)} checkpoint(s), the last {checkpoints[-1].name}" if checkpoints else
            "no checkpoint (trainer.save_freq=-1)" if save_freq <= 0 else "no checkpoint yet")
    lines = [f"[egpo] done: {len(steps)} step(s) logged, the last step {last}, in {seconds:.0f} s"
             + (f"; step {last}: {', '.join(figures)}" if figures else "") + (f"; {val}" if val else ""),
             f"[egpo] run directory: {where}: {METRICS_FILE}, {CONFIG}, {LOG}, {kept}",
             f"{REPORT_LINE} {where}"]
    return lines

