"""egpo.analyze against plain numpy and pandas over the parquet rows, and hand-worked references."""

import json
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpo.analyze import analyze
from egpo.analyze.stats import PERCENTILES, percentile_shift, top20_overlap
from egpo.analyze.tokens import load_run

from generation_rows import END, START, random_rows, write_run
from reference import cot_mask_ref


def thought_reference(prompt_ids, response_ids):
    """Per response token: inside <think> ... </think>; the response starts where the prompt's last marker left it
    (as the trainer's advantage reads it), then the spec's state machine (tests/reference.py)."""
    inside = False
    for t in prompt_ids:
        inside = True if t == START else False if t == END else inside
    return cot_mask_ref(list(response_ids), [1] * len(response_ids), START, END, starts_inside=inside)


def frame(out):
    return pd.concat([pd.read_parquet(p) for p in sorted((out / "samples").glob("part-*.parquet"))],
                     ignore_index=True)


def test_the_numbers_equal_plain_numpy_over_the_parquet_rows(tmp_path):
    out = write_run(tmp_path / "a", random_rows(0))
    analysis = analyze([out], tmp_path / "report", min_count=3, resamples=20)
    summary = analysis["runs"][0]
    df = frame(out)
    entropy = np.concatenate([np.asarray(e, dtype=np.float64) for e in df.entropy])
    assert summary["tokens"] == len(entropy)
    assert summary["mean"] == pytest.approx(entropy.mean(), abs=1e-12)
    for q in PERCENTILES:
        assert summary["percentiles"][str(q)] == pytest.approx(np.percentile(entropy, q), abs=1e-12)
    assert summary["frac_below_0.01"] == pytest.approx((entropy < 0.01).mean())
    assert summary["frac_below_0.1"] == pytest.approx((entropy < 0.1).mean())
    # thought and answer: every token walked by hand
    inside = np.concatenate([thought_reference(list(p), list(r)) for p, r in zip(df.prompt_ids, df.response_ids)])
    assert summary["thought"]["tokens"] == inside.sum() and summary["answer"]["tokens"] == (~inside).sum()
    assert summary["thought"]["percentiles"]["80"] == pytest.approx(np.percentile(entropy[inside], 80), abs=1e-12)
    assert summary["answer"]["mean"] == pytest.approx(entropy[~inside].mean(), abs=1e-12)
    # correct and incorrect responses (score >= 1; no score: neither)
    per_token_score = np.concatenate([[s] * len(e) for s, e in zip(df.score, df.entropy)])
    assert summary["correct"]["mean"] == pytest.approx(entropy[per_token_score >= 1].mean(), abs=1e-12)
    assert summary["incorrect"]["tokens"] == int((per_token_score < 1).sum())
    assert summary["correct"]["responses"] == int((df.score >= 1).sum())
    # tokens: pandas' groupby
    tokens = pd.DataFrame({"id": np.concatenate([list(r) for r in df.response_ids]), "h": entropy})
    grouped = tokens.groupby("id").h.agg(["mean", "count"])
    grouped = grouped[grouped["count"] >= 3].sort_values("mean", ascending=False)
    high = min(20, (len(grouped) + 1) // 2)  # the two lists never share a token: the higher and the lower half
    assert [t["token_id"] for t in summary["top_high"]] == grouped.index[:high].tolist()
    assert [t["mean_entropy"] for t in summary["top_high"]] == pytest.approx(grouped["mean"][:high].tolist())
    assert [t["token_id"] for t in summary["top_low"]] == grouped.index[::-1][:min(20, len(grouped) - high)].tolist()
    assert not {t["token_id"] for t in summary["top_high"]} & {t["token_id"] for t in summary["top_low"]}
    assert summary["top_high"][0]["text"] == f"#{grouped.index[0]}"  # no tokenizer: the id, not a made-up text
    # per response: the correlation of each response's mean with its length
    means = np.array([np.mean(e) for e in df.entropy])
    lengths = np.array([len(e) for e in df.entropy])
    assert summary["per_response"]["corr_mean_entropy_length"] == pytest.approx(np.corrcoef(means, lengths)[0, 1])
    written = json.loads((tmp_path / "report" / "analysis.json").read_text())
    assert written["runs"][0]["percentiles"]["80"] == summary["percentiles"]["80"]
    assert "## a" in (tmp_path / "report" / "analysis.md").read_text()


def test_the_thought_profile_is_each_thoughts_relative_position(tmp_path):
    # one thought of 4 tokens (positions 0, .25, .5, .75) and one of 2 (0, .5), then answers
    rows = [{"index": 0, "sample": 0, "prompt_ids": [START], "response_ids": [7, 8, 9, 10, END, 11],
             "entropy": [1, 2, 3, 4, 0, 9], "score": 1.0},
            {"index": 1, "sample": 0, "prompt_ids": [START], "response_ids": [7, 8, END], "entropy": [5, 6, 0],
             "score": 0.0}]
    run = load_run(write_run(tmp_path / "a", rows, parts=1))
    position = run.thought_position()
    assert np.allclose(position[np.isfinite(position)], [0, .25, .5, .75, 0, .5])
    profile = analyze([tmp_path / "a"], tmp_path / "r", min_count=1, resamples=5)["runs"][0]["thought_profile"]
    assert profile["mean_entropy"][0] == pytest.approx(3.0)  # the first tenth: 1 and 5
    assert profile["mean_entropy"][5] == pytest.approx(4.5)  # [0.5, 0.6): 3 (row 0) and 6 (row 1)
    assert profile["tokens"] == [2, 0, 1, 0, 0, 2, 0, 1, 0, 0]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_thought_split_matches_a_walk_over_the_tokens(tmp_path_factory, seed):
    out = write_run(tmp_path_factory.mktemp("run"), random_rows(seed, n_rows=12))
    run = load_run(out)
    df = frame(out)
    inside = np.concatenate([thought_reference(list(p), list(r)) for p, r in zip(df.prompt_ids, df.response_ids)])
    assert run.thought.tolist() == inside.tolist()


def shifted(rows, by):
    return [{**r, "entropy": [h + by for h in r["entropy"]]} for r in rows]


def test_a_constant_shift_on_the_same_responses_is_found_exactly_with_a_zero_width_interval(tmp_path):
    rows = random_rows(1)
    a = load_run(write_run(tmp_path / "a", rows, responses_id="same"))
    b = load_run(write_run(tmp_path / "b", shifted(rows, 0.25)[::-1], responses_id="same", parts=3))  # other order
    result = percentile_shift(a, b, paired=True, resamples=30, seed=0)
    for q, value in result["percentiles"].items():
        assert value["shift"] == pytest.approx(0.25, abs=1e-6), q
        assert value["low"] == pytest.approx(0.25, abs=1e-6) and value["high"] == pytest.approx(0.25, abs=1e-6), q
    assert result["mean"]["shift"] == pytest.approx(0.25, abs=1e-6)
    overlap = top20_overlap(a, b)
    assert overlap["overlap"] == 1.0  # the same ranking: every top position stays
    assert overlap["top_a"] == int((a.entropy >= np.percentile(a.entropy, 80)).sum())


def test_top20_overlap_against_a_set_of_positions(tmp_path):
    rows_a = random_rows(2)
    rng = np.random.default_rng(5)
    rows_b = [{**r, "entropy": rng.permutation(r["entropy"]).tolist()} for r in rows_a]  # same tokens, other values
    a = load_run(write_run(tmp_path / "a", rows_a, responses_id="x"))
    b = load_run(write_run(tmp_path / "b", rows_b[::-1], responses_id="x"))

    def top_positions(rows):
        flat = [(r["index"], r["sample"], i, np.float32(h)) for r in rows for i, h in enumerate(r["entropy"])]
        threshold = np.percentile(np.array([h for *_, h in flat], dtype=np.float64), 80)
        return {(i, s, p) for i, s, p, h in flat if h >= threshold}

    expected_a, expected_b = top_positions(rows_a), top_positions(rows_b)
    overlap = top20_overlap(a, b)
    assert overlap["both"] == len(expected_a & expected_b) and overlap["top_a"] == len(expected_a)
    assert overlap["overlap"] == pytest.approx(len(expected_a & expected_b) / len(expected_a))


def test_runs_on_different_responses_are_compared_unpaired_with_an_interval_around_the_shift(tmp_path):
    a = write_run(tmp_path / "a", random_rows(3, n_rows=200))
    b = write_run(tmp_path / "b", shifted(random_rows(4, n_rows=200), 0.5))
    comparison = analyze([a, b], tmp_path / "r", min_count=5, resamples=100)["comparisons"][0]
    assert not comparison["paired"] and comparison["top20_overlap"] is None
    mean = comparison["shift"]["mean"]
    assert mean["low"] < mean["shift"] < mean["high"] and mean["low"] > 0.3  # a 0.5-nat shift, seen as one
    moves = comparison["token_moves"]
    assert all(abs(m["shift"]) >= abs(n["shift"]) for m, n in zip(moves, moves[1:]))


def test_a_run_without_thinking_markers_has_no_thought_split(tmp_path):
    out = write_run(tmp_path / "a", random_rows(6), think=(None, None))
    summary = analyze([out], tmp_path / "r", min_count=3, resamples=5)["runs"][0]
    assert summary["thought"] is None and summary["answer"] is None and summary["thought_profile"] is None
    assert "No thinking markers" in (tmp_path / "r" / "analysis.md").read_text()


def shown_rows(out, show):
    """The rows the page shows: one sample of each prompt in turn (every prompt's sample 0, then its sample 1...)."""
    return frame(out).sort_values(["sample", "index"]).head(show)


def shown_tokens(out, show):
    return sum(len(r) for r in shown_rows(out, show).response_ids)


def test_the_page_has_one_coloured_span_per_shown_token(tmp_path):
    out = write_run(tmp_path / "a", random_rows(7))
    analyze([out], tmp_path / "r", min_count=3, resamples=5, show=5)
    page = (tmp_path / "r" / "index.html").read_text()
    assert page.count('<span class="tok"') == shown_tokens(out, 5)
    assert page.count('class="resp"') == 5


def test_each_shown_response_comes_with_its_prompt_and_its_score(tmp_path):
    out = write_run(tmp_path / "a", random_rows(7))
    analyze([out], tmp_path / "r", min_count=3, resamples=5, show=3)
    page = (tmp_path / "r" / "index.html").read_text()
    df = shown_rows(out, 3)
    assert df["index"].nunique() == 3  # three prompts, not three samples of one
    import html

    for prompt, score in zip(df.prompt, df.score):
        assert html.escape(prompt) in page
    verdicts = ["no score" if np.isnan(s) else f"score {s:g}, " + ("correct" if s >= 1 else "incorrect")
                for s in df.score]
    assert [line.split(">", 1)[1].split("<", 1)[0] for line in page.split('<div class="score"')[1:]] == verdicts
    means = [f"mean entropy {np.mean(np.asarray(e, dtype=np.float64)):.4f} nats over {len(e)} tokens"
             for e in df.entropy]
    assert [line.split(">", 1)[1].split("<", 1)[0] for line in page.split('<div class="mean"')[1:]] == means
    assert page.count('class="legend"') == 1 and "linear-gradient(to right, rgb(255,255,255)" in page


def test_a_scored_comparison_says_what_its_shift_means_and_a_response_is_plotted_with_its_forking_tokens(tmp_path):
    from egpo.analyze.page import SCORED_SHIFT

    rows = random_rows(8)
    a = write_run(tmp_path / "a", rows, responses_id="same")
    b = write_run(tmp_path / "b", shifted(rows, 0.1), responses_id="same")
    run = json.loads((b / "run.json").read_text())
    (b / "run.json").write_text(json.dumps({**run, "fingerprint": {**run.get("fingerprint", {}), "mode": "score"}}))
    analysis = analyze([a, b], tmp_path / "r", min_count=3, resamples=5, show=2)
    assert analysis["comparisons"][0]["scored"]
    assert SCORED_SHIFT in (tmp_path / "r" / "analysis.md").read_text()
    import html

    assert html.escape(SCORED_SHIFT) in (tmp_path / "r" / "index.html").read_text()
    if (tmp_path / "r" / "entropy_distribution.png").exists():  # matplotlib installed
        first = tuple(int(v) for v in shown_rows(a, 1)[["index", "sample"]].iloc[0])
        assert (tmp_path / "r" / f"response_{first[0]}_{first[1]}_entropy_along_position.png").stat().st_size > 1000
    unscored = analyze([a, write_run(tmp_path / "c", shifted(rows, 0.1), responses_id="same")], tmp_path / "r2",
                       min_count=3, resamples=5, show=2)
    assert not unscored["comparisons"][0]["scored"]
    assert SCORED_SHIFT not in (tmp_path / "r2" / "analysis.md").read_text()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no Chromium (apt-get install chromium; .ci/run installs it)")
def test_the_page_opens_in_a_headless_browser_with_a_coloured_span_per_token(tmp_path):
    """The DOM Chromium builds from index.html: every shown token is one span with a background colour, and two runs
    on the same responses are shown side by side."""
    from html.parser import HTMLParser

    rows = random_rows(8)
    a = write_run(tmp_path / "a", rows, responses_id="same")
    b = write_run(tmp_path / "b", shifted(rows, 0.1), responses_id="same")
    analyze([a, b], tmp_path / "r", min_count=3, resamples=5, show=4)
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          (tmp_path / "r" / "index.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]

    class Spans(HTMLParser):
        tokens, coloured, rows = 0, 0, []

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if tag == "span" and attrs.get("class") == "tok":
                self.tokens += 1
                self.coloured += "background-color" in attrs.get("style", "") and "title" in attrs
            if tag == "div" and attrs.get("class") == "resp":
                self.rows.append((attrs["data-run"], attrs["data-index"], attrs["data-sample"]))

    spans = Spans()
    spans.feed(dom.stdout)
    assert spans.tokens == spans.coloured == 2 * shown_tokens(a, 4)
    shown = [(i, s) for run, i, s in spans.rows if run == "a"]
    assert shown == [(i, s) for run, i, s in spans.rows if run == "b"] and len(shown) == 4
    assert "<img" in dom.stdout


def test_raw_and_temperature_scaled_entropy_are_one_distribution_at_temperature_one_only(tmp_path):
    from egpo.analyze.stats import entropy_distribution

    raw = {"of": "logits", "temperature": 1.0, "top_k": 0}
    scaled = {"of": "logits / temperature (the actor's recompute, teacher-forced)", "temperature": 1.0, "top_k": 0}
    assert entropy_distribution(raw) == entropy_distribution(scaled)
    assert entropy_distribution({**raw, "temperature": 0.7}) == entropy_distribution(raw)  # raw logits either way
    assert entropy_distribution({**scaled, "temperature": 0.7}) != entropy_distribution({**raw, "temperature": 0.7})
    rows = random_rows(9)
    a = write_run(tmp_path / "a", rows, responses_id="same", entropy_of=raw)
    b = write_run(tmp_path / "b", rows, responses_id="same", entropy_of={**scaled, "temperature": 0.7})
    comparison = analyze([a, b], tmp_path / "r", min_count=3, resamples=5)["comparisons"][0]
    assert comparison["same_entropy_definition"] is False
    assert "of different distributions" in (tmp_path / "r" / "analysis.md").read_text()


def test_the_responses_picked_are_shown_first_and_plotted_each_on_one_y_scale_across_runs(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from egpo.analyze.plots import position_figure

    rows = random_rows(8)
    a = write_run(tmp_path / "a", rows, responses_id="same")
    b = write_run(tmp_path / "b", shifted(rows, 0.7), responses_id="same")
    analysis = analyze([a, b], tmp_path / "r", min_count=3, resamples=5, show=3, plot=[(5, 1), (2, 0)])
    page = (tmp_path / "r" / "index.html").read_text()
    shown = [block.split('data-index="')[1].split('"')[0] + ":" + block.split('data-sample="')[1].split('"')[0]
             for block in page.split('class="resp"')[1:]]
    assert shown[:6] == ["5:1", "5:1", "2:0", "2:0", "0:0", "0:0"]  # each row: run a's, then run b's
    for key in ("5_1", "2_0"):
        assert (tmp_path / "r" / f"response_{key}_entropy_along_position.png").stat().st_size > 1000
    fig = position_figure(plt, [load_run(a, "a"), load_run(b, "b")], analysis, (5, 1), lambda t: f"#{t}")
    top, bottom = fig.axes
    assert top.get_ylim() == bottom.get_ylim()  # run b's tokens sit 0.7 nats higher: one scale shows it
    assert top.get_title().startswith("a: mean ") and fig.get_suptitle() == "prompt 5, sample 1: each token's entropy"
    plt.close(fig)
    with pytest.raises(SystemExit, match="--plot 99:0: no run holds that response"):
        analyze([a], tmp_path / "r3", min_count=3, resamples=5, plot=[(99, 0)])


def test_runs_in_folders_of_one_name_are_told_apart_by_their_parents(tmp_path):
    from egpo.analyze import default_names

    assert default_names([tmp_path / "grpo__seed0" / "generate_on_base",
                          tmp_path / "egpo_rollout__seed0" / "generate_on_base", tmp_path / "generate_base_scored"]) \
        == ["grpo__seed0/generate_on_base", "egpo_rollout__seed0/generate_on_base",
            f"{tmp_path.name}/generate_base_scored"]
    assert default_names([tmp_path / "a", tmp_path / "b"]) == ["a", "b"]
