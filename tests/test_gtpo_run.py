"""GRPO-S through the real verl trainer on the CPU demo, on each stack: its advantage in the driver's advantage step
and its sequence-ratio loss in verl's actor workers, reached by verl's plugin group on verl 0.9.1 and by Ray's worker
setup hook on verl 0.7.1 (the loss's own metric, actor/grpo_s_ratio_mean, exists only where egpo's loss ran). GTPO's
advantage takes the same path through the trainer (tests/test_trainer_policy.py, on both stacks)."""

import math

import pytest

from egpo.ablation.arms import ARMS
from egpo.demo.smoke_run import run_metrics, run_smoke
from test_main_cpu import COMMON

pytestmark = [pytest.mark.e2e]


def test_grpo_s_trains_with_its_loss_in_the_actor_workers(tmp_path, demo):
    proc = run_smoke(tmp_path, demo, *ARMS["grpo_s"], *COMMON, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    steps = run_metrics(tmp_path)
    assert sorted(s for s in steps if s > 0) == [1, 2], sorted(steps)
    for step in (1, 2):
        metrics = steps[step]
        assert 0.0 <= metrics["egpo/grpo_s/correct_frac"] <= 1.0
        # the sequence ratio's mean: about 1 at the first update of a step, and only egpo's loss logs it
        assert math.isfinite(metrics["actor/grpo_s_ratio_mean"]) and 0.5 < metrics["actor/grpo_s_ratio_mean"] < 2.0
        assert "egpo/cot_entropy_mean" in metrics and metrics["egpo/applied_bonus_mean"] == 0.0
