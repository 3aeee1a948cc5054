"""Run ``python -m egpo.main`` on the CPU smoke recipe in a subprocess and read its per-step metrics.

Used by the end-to-end tests and by ``bench/cpu_step.py``; handy for scripting CPU ablations.
"""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
STEP_LINE = re.compile(r"step:(\d+) - (.*)$")
# verl reduces metrics with numpy; under numpy 2 its console line shows them as np.float64(...) reprs
NUMPY_REPR = re.compile(r"^np\.\w+\((.*)\)$")


def smoke_command(workdir: Path, demo: Path, *overrides: str) -> list[str]:
    """``python -m egpo.main`` on the CPU smoke recipe, its run directory ``workdir/checkpoints``."""
    return [
        sys.executable, "-m", "egpo.main", f"--config-path={RECIPES}", "--config-name=cpu_smoke",
        f"egpo_demo.out={demo}", f"trainer.default_local_dir={workdir / 'checkpoints'}",
        "trainer.logger=[console,file]", *overrides,  # verl's console line per step: what step_metrics reads
    ]


def run_smoke(workdir: Path, demo: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(smoke_command(workdir, demo, *overrides), cwd=workdir, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def step_metrics(output: str) -> dict[int, dict[str, float]]:
    """verl's console logger lines ``step:N - key:value - ...`` -> {N: {key: value}}."""
    steps = {}
    for line in output.splitlines():
        match = STEP_LINE.search(line)
        if not match:
            continue
        metrics = {}
        for part in match.group(2).split(" - "):
            key, _, value = part.rpartition(":")
            value = NUMPY_REPR.sub(r"\1", value.strip())
            try:
                metrics[key.strip()] = float(value)
            except ValueError:
                pass
        steps.setdefault(int(match.group(1)), {}).update(metrics)  # a step's lines merged (validation after a save)
    return steps


def run_metrics(workdir: Path) -> dict[int, dict[str, float]]:
    """Each step's metrics as the run directory of :func:`run_smoke` keeps them (``metrics.jsonl``, every step once):
    unlike the console, whose lines Ray's log forwarding may split under load, whole."""
    from egpo.runs.state import METRICS_FILE, read_steps

    steps: dict[int, dict[str, float]] = {}
    for record in read_steps(workdir / "checkpoints" / METRICS_FILE):  # a step's lines merged, the later winning
        steps.setdefault(int(record["step"]), {}).update(
            {k: float(v) for k, v in record["data"].items() if isinstance(v, (int, float))})
    return steps


def egpo_metrics(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if k.startswith("egpo/")}


def all_finite(metrics: dict[str, float]) -> bool:
    return all(math.isfinite(v) for v in metrics.values())
