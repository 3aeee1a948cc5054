"""bench/gpu_update_memory.py, the script a GPU machine runs with torch and transformers alone, on a CPU: it runs
without verl's help, and the update-time entropy it adds saves what the preflight states (so the figures it prints on
a GPU compare like with like)."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "gpu_update_memory.py"


def test_the_gpu_bench_runs_on_a_cpu_and_agrees_with_the_preflight(tmp_path):
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
