"""A main job's run directory: where ``python -m egpo.main`` puts what a run produces, said at the start and at the
end.

The run directory is verl's ``trainer.default_local_dir`` (``checkpoints/<project_name>/<experiment_name>`` under
the directory the command runs in, unless set): verl's checkpoints (``global_step_N/``) and its resume pointer are
there already, and egpo adds

* ``config.yaml``: the configuration the run started with, after egpo's own settings (verl's console dump of it is
  replaced by one line naming this file: :mod:`egpo.console`);
* ``metrics.jsonl``: verl's file logger, one ``{"step": n, "data": {...}}`` line per step, each step once across
  resumed attempts (verl truncates the file it is given, so each attempt writes ``metrics.attempt.jsonl``, joined
  when it ends or when the next attempt starts; :mod:`egpo.runs.state`); ``python -m egpo.report DIR`` reads it;
* ``log.txt``: the console, every attempt appended.

A run started by ``python -m egpo.ablation`` has a run directory of the ablation's (it sets verl's file logger
path itself): nothing here applies to it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from egpo.runs.state import CONFIG, LOG, checkpoint_steps

LOGGER_PATH_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"


def run_directory(config: DictConfig) -> Path | None:
    """``trainer.default_local_dir``, resolved; None where verl's file logger writes elsewhere (set by
    ``python -m egpo.ablation``, or by hand)."""
    from egpo.runs.state import ATTEMPT_METRICS

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
    from egpo.runs.state import ATTEMPT_METRICS

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
    """The step verl will resume from (0: a fresh start), as verl decides it; with ``resume_mode=auto``, the last
    checkpoint whose step was logged, the rule every resumed run follows (:func:`egpo.runs.state.resume_point`; the
    attempt itself removes a newer one and sets verl's pointer back: :func:`resume_where_logged`). Changes nothing."""
    mode = str(config.trainer.get("resume_mode", "auto"))
    if mode == "disable":
        return 0
    if mode == "resume_path":
        tail = Path(str(config.trainer.get("resume_from_path") or "")).name
        return int(tail.rsplit("_", 1)[1]) if tail.startswith("global_step_") else 0
    from egpo.runs.state import resume_point

    return resume_point(where, where, remove=False)


def resume_where_logged(config: DictConfig, where: Path) -> tuple[int, str | None]:
    """Before an attempt: :func:`resumed_step`, with a newer checkpoint whose step was never logged removed and
    verl's pointer set back to the one it resumes from; returns the step and the line that says so (None: nothing
    was removed)."""
    from egpo.runs.state import checkpoint_pointer, resume_point

    if str(config.trainer.get("resume_mode", "auto")) != "auto":
        return resumed_step(config, where), None
    before = checkpoint_pointer(where)
    resume = resume_point(where, where)
    if resume == before:
        return resume, None
    return resume, (f"[egpo] the checkpoint of step {before} was saved but its step never logged (the run stopped "
                    f"between the two): it is removed, and the run resumes from step {resume}")


def validate_first_where_owed(config: DictConfig, where: Path, resume: int) -> str | None:
    """The attempt that reached step ``resume`` stopped during its validation: this one validates there first;
    returns the line that says so (None: nothing owed)."""
    from egpo.runs.state import validation_owed

    if not validation_owed(where, resume):
        return None
    if not config.trainer.get("val_before_train", True):
        with open_dict(config):
            config.trainer.val_before_train = True
    return (f"[egpo] step {resume}'s validation was cut short by the last attempt: it runs first, then training "
            "resumes")


REPORT_LINE = "[egpo] report: python -m egpo.report"  # the closing summary's last line
NO_STEPS_LINE = "[egpo] no step was logged"  # or its only one


class RunOutputs:
    """Around one attempt of a main job, in the driver: the run directory prepared and announced, the console copied
    to its log, the attempt's metrics joined at the end and the closing summary printed last, once the runner's
    own last lines have come through (``with RunOutputs(config): run``; the runner marks its end:
    :func:`end_runner_output`; :mod:`egpo.runner_console`)."""

    def __init__(self, config: DictConfig):
        self.config = config
        self.where = run_directory(config)
        self._log = self._console = None

    def __enter__(self):
        if self.where is None:
            return self
        from egpo.runs.state import METRICS_FILE, continue_metrics
        from egpo.runner_console import RunnerConsole

        self.where.mkdir(parents=True, exist_ok=True)
        resume, removed = resume_where_logged(self.config, self.where)
        owed = validate_first_where_owed(self.config, self.where, resume)
        continue_metrics(self.where, resume)
        try:
            text = OmegaConf.to_yaml(self.config, resolve=True)
        except Exception:  # noqa: BLE001 - an interpolation only the workers can resolve: kept as written
            text = OmegaConf.to_yaml(self.config)
        (self.where / CONFIG).write_text(text)
        self._log = (self.where / LOG).open("a", buffering=1)
        self._log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")
        self._console = RunnerConsole(closing=self._summary, log=self._log).__enter__()
        start = f"resumes from step {resume}" if resume else "starts at step 0"
        for line in (removed, owed):  # after the console is copied to the log: the run's log says it too
            if line:
                print(line, flush=True)
        print(f"[egpo] run directory: {self.where} ({start}; {CONFIG}, {METRICS_FILE}, {LOG}, "
              "checkpoints)", flush=True)
        return self

    def _summary(self, seconds: float) -> list[str]:
        from egpo.runs.state import logged_steps

        return summary_lines(self.where, logged_steps(self.where), self.config, seconds)

    def __exit__(self, kind, error, trace):
        if self.where is None:
            return False
        from egpo.runs.state import join_attempt_metrics

        try:
            join_attempt_metrics(self.where)
            self._console.__exit__(kind, error, trace)
        finally:
            self._log.close()
        return False


def end_runner_output(config: DictConfig, seconds: float) -> None:
    """At the end of verl's ``run``, in its task-runner process (egpo's runner): the runner's end marks
    (:func:`egpo.runner_console.end_runner_output`), for a run with a run directory; the driver's closing summary
    follows them, and so follows verl's own last lines (its progress bar's end among them)."""
    from egpo.runner_console import end_runner_output as mark_end

    if run_directory(config) is not None:
        mark_end(seconds)


def _last(steps: list[dict], key: str) -> tuple[int, float] | None:
    for step in reversed(steps):
        value = step.get("data", {}).get(key)
        if isinstance(value, (int, float)):
            return step["step"], float(value)
    return None


def summary_lines(where: Path, steps: list[dict], config: DictConfig, seconds: float) -> list[str]:
    """What a finished attempt says last: the steps, the latest reward and CoT entropy, the last validation's pass@k,
    where everything is, and the command that reports the run."""
    from egpo.runs.state import METRICS_FILE

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
    checkpoints = checkpoint_steps(where, where)  # by step: global_step_20 after global_step_5
    kept = (f"{len(checkpoints)} checkpoint(s), the last global_step_{checkpoints[-1]}" if checkpoints else
            "no checkpoint (trainer.save_freq=-1)" if save_freq <= 0 else "no checkpoint yet")
    lines = [f"[egpo] done: {len(steps)} step(s) logged, the last step {last}, in {seconds:.0f} s"
             + (f"; step {last}: {', '.join(figures)}" if figures else "") + (f"; {val}" if val else ""),
             f"[egpo] run directory: {where}: {METRICS_FILE}, {CONFIG}, {LOG}, {kept}",
             f"{REPORT_LINE} {where}"]
    return lines

