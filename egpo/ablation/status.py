"""``python -m egpo.ablation --status DIR``: the arms x seeds grid of an ablation directory, then a row per run."""

from __future__ import annotations

import json
from pathlib import Path

from egpo.ablation.arms import run_name
from egpo.runs.state import DONE, JOB, RUN, run_status

REWARD = ("critic/score/mean",)
COT_ENTROPY = ("egpo/cot_entropy_mean",)


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _value(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def job_alive(work: Path, clients: dict) -> bool | None:
    """Whether the run's Ray job is pending or running, asked of its cluster (None: no job, or no answer)."""
    path = work / JOB
    if not path.exists():
        return None
    job = json.loads(path.read_text())
    try:
        if job["address"] not in clients:
            from ray.job_submission import JobSubmissionClient

            clients[job["address"]] = JobSubmissionClient(job["address"])
        state = clients[job["address"]].get_job_status(job["submission_id"])
    except Exception:  # noqa: BLE001 - the cluster is gone or unreachable: the files say what they can
        clients[job["address"]] = None
        return None
    return str(getattr(state, "value", state)) in ("PENDING", "RUNNING")


def status_lines(root: Path) -> list[str]:
    """The arms x seeds grid of an ablation directory, then one row per run."""
    runs, clients, generations = {}, {}, []
    for meta in sorted(root.glob(f"*/{RUN}")):
        info = json.loads(meta.read_text())
        if "arm" not in info:  # a generation's folder (--generate: generate_base, generate_base_scored)
            generations.append(meta.parent)
            continue
        runs[(info["arm"], int(info["seed"]))] = run_status(meta.parent, job_alive(meta.parent, clients))
    if not runs:
        raise SystemExit(f"no ablation runs under {root} (no */{RUN})")
    arms = list(dict.fromkeys(arm for arm, _ in runs))
    seeds = sorted({seed for _, seed in runs})

    def cell(status) -> str:
        if status.state in ("done", "submitted"):
            return status.state
        where = f"step {status.step}/{status.steps}" if status.steps else f"step {status.step}"
        return {"running": f"running at {where}", "failed": f"FAILED at {where}"}.get(status.state, "pending")

    lines = ["| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for arm in arms:
        lines.append(f"| {arm} | " + " | ".join(cell(runs[(arm, s)]) if (arm, s) in runs else "not started"
                                                for s in seeds) + " |")
    lines += ["", "| run | state | step | wall time | reward | CoT entropy |", "|---|---|---|---|---|---|"]
    for (arm, seed), status in runs.items():
        lines.append(f"| {run_name(arm, seed)} | {status.state} | {status.step}/{status.steps or '?'} | "
                     f"{_hours(status.seconds)} | {_value(status.metric(*REWARD))} | "
                     f"{_value(status.metric(*COT_ENTROPY))} |")
    states = ("done", "running", "submitted", "failed", "pending")
    counts = {state: sum(s.state == state for s in runs.values()) for state in states}
    lines += ["", ", ".join(f"{n} {state}" for state, n in counts.items() if n) + f" of {len(runs)} run(s)"]
    generations += [meta.parent for meta in sorted(root.glob(f"*/*/{RUN}"))]  # a run's generate_on_base
    if generations:  # --generate's folders: done (done.json) or not yet
        lines.append("generations: " + ", ".join(
            f"{g.relative_to(root)} {'done' if (g / DONE).exists() else 'not done'}" for g in generations))
    return lines
