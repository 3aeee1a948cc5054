"""bench/gpu_update_memory.py, the script a GPU machine runs with torch and transformers alone, on a CPU: it runs
without verl's help, and the update-time entropy it adds saves what the preflight states (so the figures it prints on
a GPU compare like with like)."""

import json
import subprocess
import sys
from pathlib import Path
from ray_cluster import free_ports

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu_update_memory.py"


def test_the_gpu_bench_runs_on_a_cpu_and_agrees_with_the_preflight(tmp_path):
    import pytest

    from conftest import VERL

    if VERL == "0.7.1":
        pytest.skip("the bench needs torch and transformers alone, as on a bare GPU machine: on verl 0.9.1's stack")
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--model", "tiny", "--tokens", "256",
                           "--no-kernel", "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {row["mode"]: row for row in json.loads(out.read_text())["rows"]}
    entropy = rows["entropy"]
    assert abs(entropy["minus_none_bytes"] - entropy["preflight_bytes"]) < 0.02 * entropy["preflight_bytes"]
    assert entropy["preflight_bytes"] == 2 * 256 * 151_936 * 4
    assert "| 256 | entropy |" in proc.stdout


def test_the_bench_shapes_are_the_preflights():
    sys.path.insert(0, str(BENCH.parent))
    import gpu_update_memory

    from egpo.preflight.scale import KNOWN_SHAPES

    for name, shape in KNOWN_SHAPES.items():
        assert gpu_update_memory.SHAPES[name.split("/")[1].lower()] == shape


VERL_BENCH = BENCH.with_name("verl_update_memory.py")


def test_verls_own_update_bench_runs_on_a_cpu_without_ray_and_measures_the_entropy(tmp_path):
    """bench/verl_update_memory.py runs verl 0.9.1's own FSDP actor update (the qwen3_4b recipe's engine settings, a
    tiny model with Qwen3's vocabulary, 256 tokens) with Ray and datasets stood in, as on a bare GPU machine. The
    update-time entropy saves what the preflight states; checkpointed (the recipes' setting) it regenerates the same
    bytes inside the update's backward pass: checkpointing moves them, it does not remove them."""
    import os

    import pytest

    pytest.importorskip("verl.workers.engine_workers")
    from conftest import VERL

    if VERL != "0.9.1":
        pytest.skip("verl 0.9.1's engine worker (the bench's target; verl 0.7.1's FSDP actor is another code path)")
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(VERL_BENCH), "--device", "cpu", "--shape", "tiny", "--tokens", "256",
                           "--layers", "1", "--json", str(out)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "EGPO_BENCH_STAND_INS": "ray,datasets", "MASTER_PORT": str(free_ports(1)[0])})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["stand_ins"] == ["ray", "datasets"]
    # what the GPU figures need to compare like with like: the depth said, the kernel verl picked, a warm-up first
    assert "(tiny shape, 1 of its 2 layers)" in proc.stdout and "\nlog probs: " in proc.stdout
    assert "warm-up update done" in proc.stdout and all(row["layers"] == 1 for row in result["rows"])
    rows = {row["mode"]: row for row in result["rows"]}
    assert all(row["outcome"] == "ok" for row in rows.values()), rows
    figure = rows["entropy"]["preflight_entropy_bytes"]
    assert figure == 256 * 151_936 * 4  # fp32 logits on the CPU, chunked: one fp32 softmax per chunk
    extra = rows["entropy"]["saved_bytes"] - rows["none"]["saved_bytes"]
    assert abs(extra - figure) < 0.02 * figure, (extra, figure)
    checkpointed = rows["entropy_checkpointed"]["saved_bytes"] - rows["none"]["saved_bytes"]
    assert checkpointed > 0.98 * figure, (checkpointed, figure)


def test_the_gpu_run_of_verls_update_bench_keeps_the_models_state_off_the_gpu_in_train_mode(tmp_path):
    """On a GPU the bench runs at world size 1: verl's own param_offload and optimizer_offload would load the whole
    unsharded state onto the GPU for the update (verl's BaseEngineCtx), so the GPU override is FSDP2's CPU offload
    policy, under which verl turns its own two flags off and never moves the state: checked on the composed config
    and on verl's source (the GPU itself is not needed to see it)."""
    import importlib.util

    import pytest

    pytest.importorskip("verl.workers.engine_workers")
    from conftest import VERL

    if VERL != "0.9.1":
        pytest.skip("verl 0.9.1's engine worker (the bench's target)")
    from verl.utils.config import omega_conf_to_dataclass

    from egpo.compat.verl_shapes import method_source

    spec = importlib.util.spec_from_file_location("verl_update_memory", VERL_BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cfg = bench.recipe_config("qwen3_4b", tmp_path, "cuda")
    engine = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor).engine
    assert engine.offload_policy is True and engine.param_offload is False and engine.optimizer_offload is False
    built = method_source("verl.workers.engine.fsdp.transformer_impl:FSDPEngine._build_fsdp_module")
    policy = built[built.index("if self.engine_config.offload_policy"):]
    assert "self._is_offload_param = False" in policy and "self._is_offload_optimizer = False" in policy
    assert "offload_policy = CPUOffloadPolicy(" in policy
    switch = method_source("verl.workers.engine.base:BaseEngineCtx._context_switch")
    assert "is_param_offload_enabled" in switch and "is_optimizer_offload_enabled" in switch  # moves only those
