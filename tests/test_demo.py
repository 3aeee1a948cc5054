"""The locally built demo: loadable real architecture, think tokens, prompts that open <think>, graded reward."""

import pandas as pd
import pytest
import torch

from egpo.advantage import prompt_ends_inside_think
from egpo.demo.build import DATA_SOURCE, build
from egpo.demo.reward import compute_score, compute_score_solved
from egpo.preflight.think_tokens import lookup_think_token_ids


@pytest.mark.parametrize(
    "text, score",
    [("6+6 is 12</think>12", 1.0), ("6+6</think>2", 0.5), ("hmm</think> 12 done", 1.0), ("</think>13", 0.5), ("</think>", 0.5),
     ("no close 12", 0.0), ("</think>123", 0.5), ("</think>\n12\n", 1.0),
     # the span rules: a response that closes its thought twice gets nothing
     ("a</think>b</think>12", 0.0), ("a</think>12</think>b", 0.0)],
)
def test_reward(text, score):
    assert compute_score(DATA_SOURCE, text, "12") == score
    # the outcome GTPO and GRPO-S count (solved at 1.0): the half credit for the format is gone
    assert compute_score_solved(DATA_SOURCE, text, "12") == (1.0 if score == 1.0 else 0.0)


def test_build_is_complete_and_idempotent(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build(tmp_path / "demo")
    stamp = (out / "model" / "model.safetensors").stat().st_mtime_ns
    assert build(out) == out and (out / "model" / "model.safetensors").stat().st_mtime_ns == stamp
    tok = AutoTokenizer.from_pretrained(out / "model")
    model = AutoModelForCausalLM.from_pretrained(out / "model")
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.vocab_size == len(tok)
    start, end = lookup_think_token_ids(tok)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 1+2?"}], add_generation_prompt=True, return_dict=False)
    assert prompt_ends_inside_think(torch.tensor([prompt]), start, end).tolist() == [True]
    train = pd.read_parquet(out / "data" / "train.parquet")
    assert set(train.columns) >= {"data_source", "prompt", "reward_model", "extra_info"}
    assert train.reward_model.map(lambda r: r["ground_truth"]).nunique() > 5


def test_warm_start_is_seeded_and_lands_in_the_regime_of_thinking_models(tmp_path):
    from safetensors.torch import load_file

    from egpo.demo.build import build_model
    from egpo.demo.warm import fine_tune

    def tuned(name, seed):
        path = build_model(tmp_path / name, seed=0)
        fine_tune(path, seed=seed, steps=3)
        return load_file(path / "model.safetensors")

    a, b, c = tuned("a", 1), tuned("b", 1), tuned("c", 2)
    assert all(torch.equal(a[k], b[k]) for k in a)  # same seed, same weights
    assert any(not torch.equal(a[k], c[k]) for k in a)

    stats = build(tmp_path / "warm", warm=True, seed=0) / "model" / "warm_stats.json"
    import json

    measured = json.loads(stats.read_text())
    assert 0.1 <= measured["cot_entropy_mean"] <= 1.5, measured  # real thinking models: well under 1 nat a token
    assert 0.2 <= measured["accuracy"] <= 0.6, measured  # solves a real but partial share
    assert measured["think_closed"] > 0.9, measured


def test_step_lines_parse_under_numpy_2():
    """verl reduces metrics with numpy; under numpy 2 its console line shows np.float64(...) reprs."""
    from egpo.demo.smoke_run import step_metrics

    line = "(EgpoTaskRunner pid=1) step:2 - egpo/bonus_mean:np.float64(0.25) - actor/entropy:4.5 - n:np.int64(7) - x:abc"
    assert step_metrics(line) == {2: {"egpo/bonus_mean": 0.25, "actor/entropy": 4.5, "n": 7.0}}


def test_the_warm_demos_figures_the_docs_quote_are_the_shipped_models_own():
    """docs/ablation.md and docs/evidence.md quote the shipped warm model's measured statistics, not older ones."""
    import json

    from egpo.demo.build import SHIPPED_WARM

    stats = json.loads((SHIPPED_WARM / "model" / "warm_stats.json").read_text())
    docs = SHIPPED_WARM.parent / "docs"
    accuracy = f"{stats['accuracy'] * 100:.1f}%"
    assert accuracy in (docs / "ablation.md").read_text()
    evidence = (docs / "evidence.md").read_text()
    for figure in (accuracy, f"{stats['think_closed'] * 100:.1f}%", f"CoT entropy {stats['cot_entropy_mean']:.2f}"):
        assert figure in evidence, figure


def test_a_warm_demo_of_the_shipped_seed_is_the_shipped_model_copied(tmp_path, capsys):
    from egpo.demo.build import SHIPPED_WARM

    out = build(tmp_path / "demo", warm=True, seed=0)
    assert "the warm demo model: the repository's" in capsys.readouterr().out
    for name in ("model.safetensors", "warm_stats.json", "tokenizer.json"):
        assert (out / "model" / name).read_bytes() == (SHIPPED_WARM / "model" / name).read_bytes()
