"""An ablation run killed mid-step (SIGKILL, as a preempted node) resumes from its last checkpoint and ends as the
uninterrupted run of the same seed ends: every step once, the same per-step metrics, the same final weights. The
strongest proof that resuming loses and repeats nothing. Real trainer runs (the CPU smoke recipe, egpo's HF rollout
with its seeded sampling), without a cluster; tests/test_ablation_cluster.py does the same with Ray jobs."""

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from ablation_runs import RUN, STEPS, ablation, training_metrics, wait_for, weights, with_demo_data
from conftest import VERL
from egpo.run_state import ATTEMPT, ATTEMPT_METRICS, METRICS_FILE, read_steps

if VERL == "0.7.1":
    pytest.skip("the resume logic is egpo's, the same on both stacks; verl 0.7.1's own checkpoint resume is "
                "tested by the CPU main jobs (tests/test_main_cpu.py): this slow test runs on verl 0.9.1",
                allow_module_level=True)

pytestmark = [pytest.mark.e2e]


def test_a_run_killed_mid_step_resumes_to_the_uninterrupted_result(tmp_path, demo, uninterrupted_run):
    with_demo_data(tmp_path, demo)
    work = tmp_path / "cut" / RUN
    proc = subprocess.Popen(ablation(tmp_path, "cut", "--retries", "1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        # step 2 logged: its checkpoint is complete (verl saves before it logs), step 3 is under way. Had step 3's
        # checkpoint been saved but not its metrics, the run would resume from step 2 all the same (run_state)
        wait_for(lambda: any(s["step"] == 2 for s in read_steps(work / ATTEMPT_METRICS)), proc, 900,
                 "the point to interrupt it")
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
    uncut = read_steps(uninterrupted_run / METRICS_FILE)
    assert [s["step"] for s in cut] == [s["step"] for s in uncut] == [1, 2, 3]  # each step exactly once
    for ours, theirs in zip(cut, uncut):
        assert training_metrics(ours) == training_metrics(theirs), ours["step"]
    final, expected = weights(work, STEPS), weights(uninterrupted_run, STEPS)
    assert final.keys() == expected.keys()
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    # the last --keep checkpoints, no older one
    assert sorted(p.name for p in (work / "checkpoints").glob("global_step_*")) == ["global_step_2", "global_step_3"]

    status = subprocess.run([sys.executable, "-m", "egpo.ablation", "--status", str(tmp_path / "cut")],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "| egpo_rollout | done |" in status.stdout and "1 done of 1 run(s)" in status.stdout
