"""What a folder given on a command line holds, told from its files, so that each command refuses a wrong one with
what to run instead: a missing folder (with the sibling it may have meant), a training run's folder (a main job's run
directory, or one run of an ablation), an ablation's folder, or an ``egpo.generate`` run."""

from __future__ import annotations

import json
from pathlib import Path

from egpo.runs.state import CONFIG, LATEST, METRICS_FILE, RUN
from egpo.typos import did_you_mean

MISSING, GENERATION, TRAINING, ABLATION, OTHER = "missing", "generation", "training", "ablation", "other"


def _run_json(path: Path) -> dict:
    try:
        return json.loads((path / RUN).read_text())
    except (OSError, ValueError):
        return {}


def folder_kind(path: Path) -> str:
    path = Path(path)
    if not path.is_dir():
        return MISSING
    run = _run_json(path)
    if "fingerprint" in run or (path / "samples").is_dir():
        return GENERATION
    if "arm" in run or any((path / name).exists() for name in (CONFIG, METRICS_FILE, LATEST)) or \
            any(path.glob("global_step_*")):
        return TRAINING
    if any("arm" in _run_json(child) for child in path.iterdir() if child.is_dir()):
        return ABLATION
    return OTHER


def no_such_folder(option: str, path: Path) -> str:
    """``OPTION PATH: no such folder`` and, where a sibling's name is within a typo of it, that sibling."""
    path = Path(path)
    parent = path.expanduser().resolve().parent
    siblings = [child.name for child in parent.iterdir() if child.is_dir()] if parent.is_dir() else []
    meant = did_you_mean(path.name, siblings, cutoff=0.7, show=lambda name: path.parent / name)
    return f"{option}{' ' if option else ''}{path}: no such folder{meant}"


def generate_from(run_dir: Path) -> str:
    """The command that samples from a training run's last checkpoint into a folder inside it."""
    return (f'python -m egpo.generate --config-path="$PWD/recipes" --config-name=<the recipe it trained with> '
            f"--checkpoint {run_dir} --out {Path(run_dir) / 'generate'}")

