"""``egpo.ablation --generate``: the ablation's question token by token, after its runs finish.

Three kinds of ``python -m egpo.generate`` runs, on the recipe's validation prompts, each skipped once done:

* ``OUT/generate_base``: the recipe's model before training samples every prompt (the common responses);
* ``OUT/<run>/generate``: the run's last checkpoint samples every prompt (with the run's seed);
* ``OUT/generate_base_scored``: the base responses teacher-forced through the base model itself (the actor's
  recompute, as the checkpoints read them: the engine's entropy of the base's samples differs from a recompute by the
  engine-vs-FSDP mismatch, so the base side of every comparison is a recompute too);
* ``OUT/<run>/generate_on_base``: the base responses teacher-forced through the run's last checkpoint, so that every
  run's entropy is read on the same tokens (its shift, and the overlap of its top-20% positions with the base's):
  recompute against recompute, so a model that did not change shows a shift of 0 and an overlap of 1 on any engine.

``egpo.report`` reads them (:func:`egpo.analyze.run_figures.token_metrics`) as per-run figures at the run's last step,
paired by seed like every other metric.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from egpo.ablation.arms import ARMS, seed_overrides
from egpo.ablation.attempt import override_value
from egpo.runs.ablation_dir import BASE, BASE_SCORED, GENERATED, ON_BASE  # noqa: F401 - its folders, named there
from egpo.runs.state import CHECKPOINTS, DONE, RUN

def generation_commands(out: Path, runs: list[Path], config_path: str, config_name: str, overrides: list[str],
                        demo: Path | None, n: int | None, max_rows: int | None,
                        python: str = sys.executable) -> list[list[str]]:
    """The generation commands still to run, in order (the base's first: the others score its responses)."""
    import json

    common = [python, "-m", "egpo.generate", f"--config-path={Path(config_path).resolve()}",
              f"--config-name={config_name}", *([f"egpo_demo.out={override_value(demo)}"] if demo else []),
              *overrides, *(["--n", str(n)] if n else []), *(["--max-rows", str(max_rows)] if max_rows else [])]
    commands = []
    if not (out / BASE / DONE).exists():
        commands.append([*common, "--out", str(out / BASE)])
    if not (out / BASE_SCORED / DONE).exists():
        commands.append([*common, "--score", str(out / BASE), "--out", str(out / BASE_SCORED)])
    for work in runs:
        info = json.loads((work / RUN).read_text())
        arm, seed = info["arm"], int(info["seed"])
        own = [*common, *ARMS[arm], *seed_overrides(seed), "--checkpoint", str(work / CHECKPOINTS)]
        if not (work / GENERATED / DONE).exists():
            commands.append([*own, "--out", str(work / GENERATED)])
        if not (work / ON_BASE / DONE).exists():
            commands.append([*own, "--score", str(out / BASE), "--out", str(work / ON_BASE)])
    return commands


def run_logged(command: list[str], log, label: str) -> int:
    """``command``'s output into ``log``, its progress bar (:mod:`egpo.generate.progress`) also on the console."""
    from egpo.ablation.progress import generation_progress

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for line in proc.stdout:
        log.write(line)
        bar = generation_progress(line)
        if bar:
            log.flush()
            print(f"{label}: {bar}", flush=True)
    return proc.wait()


def run_generation(commands: list[list[str]]) -> list[str]:
    """Runs each command (its output to its folder's ``generate.log``); returns the folders that failed."""
    failed = []
    for i, command in enumerate(commands, 1):
        target = Path(command[command.index("--out") + 1])
        target.mkdir(parents=True, exist_ok=True)
        print(f"[ablation] generate {i}/{len(commands)}: {target}; its console: {target / 'generate.log'}", flush=True)
        label = f"[ablation] generate {i}/{len(commands)}"
        with open(target / "generate.log", "a") as log:
            status = run_logged(command, log, label)
        if status:
            print(f"[ablation] generate FAILED (rc {status}): {target}; its log: {target / 'generate.log'}",
                  flush=True)
            failed.append(str(target))
    return failed
