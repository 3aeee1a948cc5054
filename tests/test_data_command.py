"""python -m egpo.data on the small samples shipped in tests/data (the hub formats; nothing downloaded)."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from verl.utils.reward_score import default_compute_score

SAMPLES = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("name, truths, correct", [
    ("gsm8k", ["72", "2400", "-2"], "Natalia sold 24 in May, 72 in all.\n#### 72"),
    ("math", ["\\frac{5}{6}", "1024", "2\\sqrt{2}"], "so the answer is $\\boxed{\\frac{5}{6}}$"),
])
def test_rows_in_verls_format_scored_by_verls_default_reward(tmp_path, name, truths, correct):
    proc = subprocess.run([sys.executable, "-m", "egpo.data", name, "--input", str(SAMPLES / f"{name}_sample.jsonl"),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = pd.read_parquet(tmp_path / f"{name}_train.parquet")
    assert list(rows.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert [r["ground_truth"] for r in rows.reward_model] == truths
    first = rows.iloc[0]
    assert set(first.prompt[0]) == {"role", "content"} and first.prompt[0]["role"] == "user"
    assert first.extra_info["split"] == "train" and first.extra_info["index"] == 0
    # verl's default reward routes the data_source and scores a right answer 1, a wrong one 0
    assert default_compute_score(first.data_source, correct, first.reward_model["ground_truth"]) == 1.0
    assert default_compute_score(first.data_source, correct.replace("72", "71").replace("5}{6", "4}{6"),
                                 first.reward_model["ground_truth"]) == 0.0


def test_a_record_without_the_hub_fields_is_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "1+1?", "a": "2"}\n')
    proc = subprocess.run([sys.executable, "-m", "egpo.data", "gsm8k", "--input", str(bad), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "expected the hub's fields ('question', 'answer')" in proc.stderr


def test_an_unreachable_hub_is_one_line_naming_input_within_seconds(tmp_path):
    """Offline (the hub's host refuses, as on a cluster login node) and nothing cached: one line, no traceback,
    the --input command that works instead; no 24 s of retries."""
    import os
    import time

    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"),
           "HF_DATASETS_CACHE": str(tmp_path / "hf" / "datasets")}
    env.pop("HF_HUB_OFFLINE", None)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "egpo.data", "math", "--out", str(tmp_path / "data")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert time.monotonic() - start < 60
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("python -m egpo.data")]
    assert "the hub (127.0.0.1:9) cannot be reached" in line and "DigitalLearningGmbH/MATH-lighteval" in line
    assert "python -m egpo.data math --input FILE --split train --out DIR" in line and "problem and solution" in line
