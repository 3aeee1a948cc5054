"""An ablation run killed mid-step (SIGKILL, as a preempted node) resumes from its last checkpoint and ends as the
uninterrupted run of the same seed ends: every step once, the same per-step metrics, the same final weights. The
strongest proof that resuming loses and repeats nothing. Real trainer runs (the CPU smoke recipe, egpo's HF rollout
with its seeded sampling); about four minutes on 2 cores."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import VERL
from egpo.run_state import ATTEMPT, ATTEMPT_METRICS, METRICS_FILE, read_steps
from test_recipes import RECIPES

if VERL == "0.7.1":
    pytest.skip("the resume logic is egpo's, the same on both stacks; verl 0.7.1's own checkpoint resume is "
                "tested by the CPU main jobs (tests/test_main_cpu.py): this slow test runs on verl 0.9.1",
                allow_module_level=True)

pytestmark = [pytest.mark.e2e]
RUN = "egpo_rollout__seed0"
STEPS = 3
# what a step measures about its machine, not about the training: left out of the comparison
MACHINE = ("timing", "perf/", "time", "throughput", "memory")


def ablation(tmp_path, out, *extra):
    return [sys.executable, "-m", "egpo.ablation", f"--config-path={RECIPES}", "--config-name=cpu_smoke",
            "--arms", "egpo_rollout", "--seeds", "0", "--steps", str(STEPS), "--save-every", "1", "--keep", "2",
            "--out", str(tmp_path / out), *extra, "actor_rollout_ref.rollout.n=8",
            "data.train_files=data/train.parquet", "data.val_files=data/val.parquet"]


def weights(work, step):
    state = torch.load(work / "checkpoints" / f"global_step_{step}" / "actor" / "model_world_size_1_rank_0.pt",
                       weights_only=False)
    return {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}


def training_metrics(step):
    return {k: v for k, v in step["data"].items() if not any(m in k for m in MACHINE)}


def wait_for(predicate, proc, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return
        assert proc.poll() is None, "the ablation ended before the point to interrupt it"
        time.sleep(0.5)
    raise AssertionError("timed out waiting to interrupt the run")


def test_a_run_killed_mid_step_resumes_to_the_uninterrupted_result(tmp_path, demo):
    import shutil

    shutil.copytree(demo / "data", tmp_path / "data")
    whole = subprocess.run(ablation(tmp_path, "whole"), capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert whole.returncode == 0, whole.stdout[-3000:] + whole.stderr[-3000:]

    work = tmp_path / "cut" / RUN
    proc = subprocess.Popen(ablation(tmp_path, "cut", "--retries", "1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        # step 2 logged: its checkpoint is complete (verl saves before it logs), step 3 is under way. Had step 3's
        # checkpoint been saved but not its metrics, the run would resume from step 2 all the same (run_state)
        wait_for(lambda: any(s["step"] == 2 for s in read_steps(work / ATTEMPT_METRICS)), proc, 900)
        run_pid = json.loads((work / ATTEMPT).read_text())["pid"]
        os.killpg(run_pid, signal.SIGKILL)  # the run and everything it started (Ray's processes), mid-step
        stdout, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stdout[-5000:]
    assert "FAILED (rc -9)" in stdout and "retrying from its last checkpoint" in stdout
    assert "done in" in stdout and "(from step 2)" in stdout, stdout[-4000:]

    cut = read_steps(work / METRICS_FILE)
    uncut = read_steps(tmp_path / "whole" / RUN / METRICS_FILE)
    assert [s["step"] for s in cut] == [s["step"] for s in uncut] == [1, 2, 3]  # each step exactly once
    for ours, theirs in zip(cut, uncut):
        assert training_metrics(ours) == training_metrics(theirs), ours["step"]
    final, expected = weights(work, STEPS), weights(tmp_path / "whole" / RUN, STEPS)
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    # the last --keep checkpoints, no older one
    assert sorted(p.name for p in (work / "checkpoints").glob("global_step_*")) == ["global_step_2", "global_step_3"]

    status = subprocess.run([sys.executable, "-m", "egpo.ablation", "--status", str(tmp_path / "cut")],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "| egpo_rollout | done |" in status.stdout and "1 done of 1 run(s)" in status.stdout
