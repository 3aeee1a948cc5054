"""The ablation's runs on this machine, one after the other, each failed attempt retried from its last checkpoint."""

from __future__ import annotations

from pathlib import Path

from egpo.ablation.attempt import log_tail, run_attempt
from egpo.ablation.progress import StepProgress
from egpo.run_state import DONE, LOG, RUN


def run_steps(work: Path) -> int:
    """The training steps the run was asked for (its run.json)."""
    import json

    return int(json.loads((work / RUN).read_text())["steps"])


def run_locally(runs: list[Path], retries: int) -> list[str]:
    """Runs each prepared run directory (``run.json`` written) to its end; returns the names of those that failed
    every attempt. A run that finished before (``done.json``) is skipped."""
    failed = []
    for i, work in enumerate(runs, 1):
        name = work.name
        if (work / DONE).exists():
            print(f"[ablation] {i}/{len(runs)} {name}: done before, skipped", flush=True)
            continue
        label = f"[ablation] {i}/{len(runs)} {name}"
        for attempt in range(retries + 1):
            print(f"{label}: running ({run_steps(work)} steps); its console: {work / LOG}", flush=True)
            result = run_attempt(work, own_session=True, on_line=StepProgress(label, run_steps(work)))
            if result["returncode"] == 0:
                print(f"[ablation] {i}/{len(runs)} {name}: done in {result['seconds']} s (from step "
                      f"{result['resumed_from']})", flush=True)
                break
            again = attempt < retries
            print(f"[ablation] {i}/{len(runs)} {name}: FAILED (rc {result['returncode']}) in {result['seconds']} s"
                  f"{', retrying from its last checkpoint' if again else ''}; the end of {name}/log.txt:\n"
                  + log_tail(work), flush=True)
        else:
            failed.append(name)
    return failed
