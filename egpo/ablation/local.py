"""The ablation's runs on this machine, one after the other, each failed attempt retried from its last checkpoint."""

from __future__ import annotations

from pathlib import Path

from egpo.ablation.attempt import FAST_FAILURE_LIMIT, last_step, log_tail, run_attempt, stalled
from egpo.ablation.progress import StepProgress
from egpo.runs.state import DONE, LOG, RUN


def run_steps(work: Path) -> int:
    """The training steps the run was asked for (its run.json)."""
    import json

    return int(json.loads((work / RUN).read_text())["steps"])


def run_locally(runs: list[Path], retries: int) -> list[str]:
    """Runs each prepared run directory (``run.json`` written) to its end; returns the names of those that failed
    every attempt. A run that finished before (``done.json``) is skipped. After :data:`FAST_FAILURE_LIMIT` failed
    attempts in a row that logged no step (a start-up error every run meets), no further run is started."""
    failed, fast = [], []
    for i, work in enumerate(runs, 1):
        name = work.name
        if (work / DONE).exists():
            print(f"[ablation] {i}/{len(runs)} {name}: done before, skipped", flush=True)
            continue
        label, steps = f"[ablation] {i}/{len(runs)} {name}", run_steps(work)
        for attempt in range(retries + 1):
            print(f"{label}: running ({steps} steps); its console: {work / LOG}", flush=True)
            result = run_attempt(work, own_session=True, on_line=StepProgress(label, steps))
            if result["returncode"] == 0:
                fast.clear()
                print(f"{label}: done in {result['seconds']} s (from step {result['resumed_from']})", flush=True)
                break
            again = attempt < retries
            print(f"{label}: FAILED (rc {result['returncode']}) in {result['seconds']} s"
                  f"{', retrying from its last checkpoint' if again else ''}; the end of {name}/log.txt:\n"
                  + log_tail(work), flush=True)
            if last_step(work) <= result["resumed_from"] and not stalled(work):
                fast.append(name)
            else:
                fast.clear()
            if len(fast) >= FAST_FAILURE_LIMIT:
                left = len(runs) - i
                raise SystemExit(
                    f"[ablation] {len(fast)} attempts in a row failed before logging a step ({', '.join(fast)}): no "
                    f"further run was started, so that one start-up error does not fail every run. {left} run(s) not "
                    f"started{'; failed: ' + ', '.join(failed) if failed else ''}. Read the log.txt above, fix the "
                    "config or the machine, and rerun the same command: it resumes every run from its last checkpoint")
        else:
            failed.append(name)
    return failed
