"""One run's state on disk: its checkpoints, its metrics across interrupted attempts, and its status (an ablation's
runs; a main job's run directory uses the same metrics files, :mod:`egpo.runs.main_dir`).

A run directory (``DIR/<arm>__seed<k>``) holds ``run.json`` (the command), ``checkpoints/`` (verl's, with
``latest_checkpointed_iteration.txt``), ``metrics.jsonl`` (one ``{"step": n, "data": {...}}`` line per finished step,
each step once), ``log.txt``, and while an attempt runs ``attempt.json`` and ``metrics.attempt.jsonl`` (verl's file
logger truncates the file it is given, so each attempt writes its own). ``done.json`` marks a finished run,
``failed.json`` the last failed attempt; on a Ray cluster, ``job.json`` names the job of the latest attempt.

An attempt resumes from the last checkpoint (verl's ``trainer.resume_mode=auto``) and logs every step after it again,
so before it starts, the steps logged after that checkpoint by the attempt that died are dropped: every step appears
exactly once, from the attempt whose weights the run goes on from (:func:`begin_attempt`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

CHECKPOINTS = "checkpoints"
LATEST = "latest_checkpointed_iteration.txt"  # written by verl after each complete checkpoint
METRICS_FILE = "metrics.jsonl"
ATTEMPT_METRICS = "metrics.attempt.jsonl"
ATTEMPT = "attempt.json"
DONE = "done.json"
FAILED = "failed.json"
RUN = "run.json"
JOB = "job.json"  # the Ray job running the run's attempt, when the ablation dispatches to a cluster
LOG = "log.txt"  # the console, every attempt appended
CONFIG = "config.yaml"  # a main job's configuration as it started (egpo.runs.main_dir)
NODES = "nodes.json"  # in the checkpoint folder: the nodes of the attempt's placement groups (its GPU workers)
# in a global_step_N folder: step N's validation was owed when the run stopped (egpo.trainer.validation_after_log)
VALIDATION_OWED = "egpo_validation_owed"
TRAINING_STEP_KEY = "timing_s/step"  # in a training step's logged line (verl's timing); a validation-only line has none


def checkpoint_pointer(directory: Path) -> int:
    """The step verl's resume pointer in a checkpoint directory names (0: none)."""
    latest = directory / LATEST
    text = latest.read_text().strip() if latest.exists() else ""
    return int(text) if text.isdigit() else 0


def last_checkpoint(work: Path, checkpoints: Path | None = None) -> int:
    """The step of the run's last complete checkpoint (0: none); ``checkpoints``: where verl saves them (an ablation
    run's ``checkpoints/``, or a main job's run directory itself)."""
    return checkpoint_pointer(checkpoints or work / CHECKPOINTS)


def validation_owed_marker(checkpoints: Path, step: int) -> Path:
    """Where a save step's owed validation is marked: in the step's checkpoint folder."""
    return Path(checkpoints) / f"global_step_{step}" / VALIDATION_OWED


def validation_owed(checkpoints: Path, step: int) -> bool:
    """The run stopped during the validation of step ``step``, after saving it and logging its training line: the
    attempt that resumes there validates before it trains."""
    return step > 0 and validation_owed_marker(checkpoints, step).exists()


def read_steps(path: Path) -> list[dict]:
    """The metric lines of ``path`` (a line cut off by a kill mid-write is not a step: it is left out)."""
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return steps


def _write_steps(path: Path, steps: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(s) + "\n" for s in steps))
    os.replace(tmp, path)


def logged_steps(work: Path) -> list[dict]:
    """Every step logged so far, the running attempt's included, each once. Lines of one step are merged key by key,
    the later line's value winning: verl logs a step in more than one line (a resumed attempt's validation before
    training is logged at the step it resumes from, whose training metrics an earlier line holds)."""
    by_step: dict[int, dict] = {}
    for line in [*read_steps(work / METRICS_FILE), *read_steps(work / ATTEMPT_METRICS)]:
        step = by_step.setdefault(line["step"], {"step": line["step"], "data": {}})
        step["data"].update(line.get("data", {}))
        step.update({k: v for k, v in line.items() if k not in ("step", "data")})
    return [by_step[k] for k in sorted(by_step)]


def checkpoint_steps(work: Path, checkpoints: Path | None = None) -> list[int]:
    """The steps of the run's ``global_step_N`` folders, in order; ``checkpoints``: as for :func:`last_checkpoint`."""
    root = checkpoints or work / CHECKPOINTS
    if not root.exists():
        return []
    suffixes = (p.name.rsplit("_", 1)[1] for p in root.glob("global_step_*"))
    return sorted(int(s) for s in suffixes if s.isdigit())


def resume_point(work: Path, checkpoints: Path | None = None, remove: bool = True) -> int:
    """The checkpoint the next attempt resumes from: the last one whose step was logged. A checkpoint counts once its
    step's line is logged: egpo's trainer logs a step that saved before it validates
    (:mod:`egpo.trainer.validation_after_log`), so only a run stopped in the seconds between the save and that log
    holds a newer checkpoint. That step's metrics exist nowhere: the newer checkpoints are removed, verl's pointer set
    back, and the unlogged step runs again, to the same result. ``checkpoints``: as for :func:`last_checkpoint`;
    ``remove=False``: the step only, nothing changed (a preflight's question)."""
    root = checkpoints or work / CHECKPOINTS
    latest = last_checkpoint(work, root)
    if not (work / METRICS_FILE).exists() and not (work / ATTEMPT_METRICS).exists():
        return latest  # checkpoints of a run egpo never logged (verl's own entry point, say): verl's pointer stands
    logged = max((s["step"] for s in logged_steps(work)), default=0)
    if latest <= logged:
        return latest
    resume = max((s for s in checkpoint_steps(work, root)
                  if s <= logged and (root / f"global_step_{s}" / "actor").exists()), default=0)
    if not remove:
        return resume
    for step in checkpoint_steps(work, root):
        if step > resume:
            shutil.rmtree(root / f"global_step_{step}", ignore_errors=True)
    pointer = root / LATEST
    if resume:
        pointer.write_text(str(resume))
    else:
        pointer.unlink(missing_ok=True)
    return resume


def begin_attempt(work: Path) -> tuple[int, Path]:
    """Before an attempt: the steps up to the checkpoint it resumes from kept in ``metrics.jsonl``, the rest dropped
    (the attempt logs them again); every checkpoint but the one it resumes from removed (verl's rotation knows only
    the checkpoints its own attempt saved, so older ones would stay until the run ends: a resumed run would hold
    2 x keep, not keep + 1); returns (the step it resumes from, the file its logger writes)."""
    resume = resume_point(work)
    for step in checkpoint_steps(work):
        if step != resume:
            shutil.rmtree(work / CHECKPOINTS / f"global_step_{step}", ignore_errors=True)
    kept = [s for s in logged_steps(work) if s["step"] <= resume]
    _write_steps(work / METRICS_FILE, kept)
    (work / ATTEMPT_METRICS).unlink(missing_ok=True)
    (work / CHECKPOINTS / NODES).unlink(missing_ok=True)  # the attempt records its own
    return resume, work / ATTEMPT_METRICS


def run_nodes(work: Path) -> list[str]:
    """The nodes the run's attempt placed its workers on (``nodes.json``; empty: not placed yet, or not recorded)."""
    try:
        return list(json.loads((work / CHECKPOINTS / NODES).read_text()).get("nodes", []))
    except (OSError, ValueError):
        return []


def continue_metrics(work: Path, resume: int) -> None:
    """Before a main job's attempt (:mod:`egpo.runs.main_dir`): an earlier attempt's steps joined, those up to the step it
    resumes from kept (verl logs the later ones again; 0: a fresh start keeps none)."""
    _write_steps(work / METRICS_FILE, [s for s in logged_steps(work) if s["step"] <= resume])
    (work / ATTEMPT_METRICS).unlink(missing_ok=True)


def join_attempt_metrics(work: Path) -> list[dict]:
    """After a main job's attempt: its steps joined to ``metrics.jsonl``; returns every step."""
    steps = logged_steps(work)
    _write_steps(work / METRICS_FILE, steps)
    (work / ATTEMPT_METRICS).unlink(missing_ok=True)
    return steps


def record_attempt(work: Path, pid: int, resume: int) -> None:
    """``attempt.json``: the training's process (on which machine), while the attempt runs."""
    (work / ATTEMPT).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "resumed_from": resume,
                                            "started": time.time()}) + "\n")


def end_attempt(work: Path, result: dict, keep: int) -> None:
    """After an attempt: its steps joined to ``metrics.jsonl`` when it finished, the outcome recorded, checkpoints
    beyond the last ``keep`` removed."""
    if result["returncode"] == 0:
        _write_steps(work / METRICS_FILE, logged_steps(work))
        (work / ATTEMPT_METRICS).unlink(missing_ok=True)
        (work / DONE).write_text(json.dumps(result) + "\n")
        (work / FAILED).unlink(missing_ok=True)
    else:
        (work / FAILED).write_text(json.dumps(result) + "\n")
    (work / ATTEMPT).unlink(missing_ok=True)
    prune_checkpoints(work, keep)


def prune_checkpoints(work: Path, keep: int) -> list[Path]:
    """Removes the ``global_step_*`` directories beyond the last ``keep`` (never the one verl resumes from)."""
    steps = checkpoint_steps(work)
    latest = last_checkpoint(work)
    removed = []
    for step in steps[:-keep] if keep > 0 else []:
        if step != latest:
            path = work / CHECKPOINTS / f"global_step_{step}"
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class RunStatus:
    state: str  # done | running | submitted | failed | pending
    step: int  # the last step logged
    steps: int  # the steps the run was asked for (0: unknown)
    seconds: float | None  # wall time: of the finished run, or so far
    last: dict  # the last logged step's metrics

    def metric(self, *keys: str):
        return next((self.last[k] for k in keys if k in self.last), None)


def run_status(work: Path, job_alive: bool | None = None) -> RunStatus:
    """The run's state. ``job_alive``: whether the Ray job of its attempt is pending or running, where the ablation
    could ask Ray (None: not a job, or Ray not reachable); otherwise an attempt on this machine is alive while its
    process is, and one on another machine is taken to be."""
    logged = logged_steps(work)
    step = logged[-1]["step"] if logged else 0
    last = logged[-1]["data"] if logged else {}
    steps = json.loads((work / RUN).read_text()).get("steps", 0) if (work / RUN).exists() else 0
    if (work / DONE).exists():
        return RunStatus("done", step, steps, json.loads((work / DONE).read_text()).get("seconds"), last)
    attempt = json.loads((work / ATTEMPT).read_text()) if (work / ATTEMPT).exists() else None
    if job_alive is not None:
        alive = job_alive
    elif attempt is not None:
        alive = attempt.get("host", socket.gethostname()) != socket.gethostname() or _alive(int(attempt["pid"]))
    else:
        alive = False
    if alive and attempt is None:  # a Ray job waiting for its node
        return RunStatus("submitted", step, steps, None, last)
    if alive:
        return RunStatus("running", step, steps, time.time() - float(attempt["started"]), last)
    if (work / FAILED).exists() or attempt is not None:
        failed = json.loads((work / FAILED).read_text()) if (work / FAILED).exists() else {}
        return RunStatus("failed", step, steps, failed.get("seconds"), last)
    return RunStatus("pending", step, steps, None, last)


VERSIONED = ("verl", "torch", "transformers", "sglang", "vllm", "ray")


def installed_versions() -> dict[str, str | None]:
    """What a run's numbers depend on, as installed where the run was started (None: not installed); a run's
    ``run.json`` keeps them for the report."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in VERSIONED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found
