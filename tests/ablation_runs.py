"""What the ablation's interruption tests share: the ablation command on the CPU smoke recipe, an uninterrupted run
to compare with, and how a run's weights and training metrics are read."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from test_recipes import RECIPES

ARM = "egpo_rollout_bypass"  # the rollout's entropy in bypass mode: no old-log-prob recompute at all
RUN = f"{ARM}__seed0"
STEPS = 3
# every run here also reads the response span on a model whose tokenizer has no <think> (refused for egpo_span=cot):
# the one end-to-end run of bypass mode and the response span (tests/test_main_cpu.py reads its metrics)
NO_THINKING_MODEL = "model_no_thinking"
# what a step measures about its machine, not about the training: left out of the comparison
MACHINE = ("timing", "perf/", "time", "throughput", "memory")


def ablation(root: Path, out: str, *extra: str, arms=(ARM,), seeds=(0,)) -> list[str]:
    """The ablation command, run in ``root`` (which holds the demo's data as ``data/`` and its model without thinking
    markers: :func:`with_demo_data`)."""
    return [sys.executable, "-m", "egpo.ablation", f"--config-path={RECIPES}", "--config-name=cpu_smoke",
            "--arms", *arms, "--seeds", *map(str, seeds), "--steps", str(STEPS), "--save-every", "1", "--keep", "2",
            "--out", str(root / out), *extra, "actor_rollout_ref.rollout.n=8",
            "data.train_files=data/train.parquet", "data.val_files=data/val.parquet",
            f"actor_rollout_ref.model.path={root / NO_THINKING_MODEL}", "algorithm.egpo_span=response",
            "reward.custom_reward_function.name=compute_score_no_thinking"]


def with_demo_data(root: Path, demo: Path) -> Path:
    """``root`` with the demo's data, and its model with a tokenizer that has no thinking markers."""
    from egpo.demo.tokenizer import build_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(demo / "data", root / "data")
    shutil.copytree(demo / "model", root / NO_THINKING_MODEL)
    build_tokenizer(with_think_tokens=False).save_pretrained(root / NO_THINKING_MODEL)
    return root


def uninterrupted(root: Path) -> Path:
    """The run directory of an uninterrupted ablation run of ``RUN``."""
    whole = subprocess.run(ablation(root, "whole"), capture_output=True, text=True, timeout=1200, cwd=root)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]
    return root / "whole" / RUN


def weights(work: Path, step: int) -> dict:
    state = torch.load(work / "checkpoints" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt",
                       weights_only=False)
    return {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}


def training_metrics(step: dict) -> dict:
    return {k: v for k, v in step["data"].items() if not any(m in k for m in MACHINE)}


def wait_for(predicate, proc, timeout: float, what: str) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        assert proc.poll() is None, f"the ablation ended before {what}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")
