"""``python -m egpo.generate`` for real on verl 0.7.1: verl's workers, egpo's HF rollout server, the demo model, on a
CPU. The generated entropy and log probabilities equal a float64 recompute of the model's logits; ``--score`` of a
run by its own model reproduces them on the same tokens; the analysis reads both. On verl 0.9.1 README's chain runs
as written instead, a killed run finishing to the uninterrupted rows and a checkpoint's scoring among it
(tests/test_readme_chain.py). About 40 s per command on 2 cores.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import VERL
from generate_runs import COLUMNS, command, float64_recompute, generate, hf_model, max_abs_diff, rows

pytestmark = pytest.mark.e2e


@pytest.mark.skipif(VERL == "0.9.1", reason="on verl 0.9.1 README's chain generates, scores a checkpoint and "
                    "analyses (tests/test_readme_chain.py): this chain runs on verl 0.7.1")
def test_generate_score_and_analyze(tmp_path, demo, monkeypatch, capsys):
    out, scored = tmp_path / "base", tmp_path / "base_scored"
    proc = generate(tmp_path, demo, "--out", out, "--max-rows", 4, "--n", 2, "--chunk", 2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[egpo] generate [##########----------] 4/8 samples" in proc.stdout, proc.stdout[-3000:]
    assert f"[egpo] generate: 8 rows in {out / 'samples'}" in proc.stdout
    assert sorted(p.name for p in (out / "samples").iterdir()) == ["part-00000.parquet", "part-00001.parquet"]
    frame = rows(out)
    assert list(frame.columns) == COLUMNS
    assert frame["index"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and frame["sample"].tolist() == [0, 1] * 4
    assert all(len(e) == len(r) == len(p) > 0 for e, r, p in zip(frame.entropy, frame.response_ids, frame.log_prob))
    assert frame.score.notna().all()  # the demo's reward function ran
    run = json.loads((out / "run.json").read_text())
    assert run["entropy"] == {"of": "logits", "temperature": 1.0, "top_k": 0}
    assert None not in run["think_token_ids"] and run["versions"]["verl"] == VERL
    assert json.loads((out / "done.json").read_text())["rows"] == 8

    # the engine's numbers against the model's logits in float64
    entropy, log_prob = float64_recompute(hf_model(demo / "model"), frame)
    assert max_abs_diff(frame.entropy, entropy) <= 1e-4
    assert max_abs_diff(frame.log_prob, log_prob) <= 1e-4

    proc = generate(tmp_path, demo, "--score", out, "--out", scored)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = rows(scored)
    for column in ("index", "sample", "score"):
        assert again[column].tolist() == frame[column].tolist()
    assert [list(r) for r in again.response_ids] == [list(r) for r in frame.response_ids]
    assert max_abs_diff(again.entropy, frame.entropy) <= 1e-4  # the actor's recompute of the same tokens
    assert max_abs_diff(again.log_prob, frame.log_prob) <= 1e-4
    assert json.loads((scored / "run.json").read_text())["responses_id"] == run["responses_id"]

    analysis = subprocess.run([sys.executable, "-m", "egpo.analyze", str(out), str(scored), "--out",
                               str(tmp_path / "analysis"), "--min-count", "2", "--bootstrap", "50"],
                              capture_output=True, text=True, timeout=300)
    assert analysis.returncode == 0, analysis.stderr[-3000:]
    result = json.loads((tmp_path / "analysis" / "analysis.json").read_text())
    flat = np.concatenate([np.asarray(e, dtype=np.float64) for e in frame.entropy])
    assert result["runs"][0]["tokens"] == len(flat)
    assert result["runs"][0]["percentiles"]["80"] == pytest.approx(np.percentile(flat, 80), abs=1e-9)
    assert result["comparisons"][0]["paired"] and result["comparisons"][0]["top20_overlap"]["overlap"] >= 0.9
    assert result["runs"][0]["top_high"][0]["text"]  # decoded by the demo's tokenizer

    # the same command again: nothing to do, said at once, before Ray (so read here, in this process); another
    # --max-rows on the same --out is refused, naming what changed
    from egpo.generate.__main__ import main as generate_main

    monkeypatch.chdir(tmp_path)
    generate_main(command(demo, "--out", out, "--max-rows", 4, "--n", 2, "--chunk", 2)[3:])
    assert "is complete (done.json); nothing to do" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="max_rows: 4 there, 5 now"):
        generate_main(command(demo, "--out", out, "--max-rows", 5, "--n", 2, "--chunk", 2)[3:])
