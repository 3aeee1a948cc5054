"""``python -m egpo.analyze DIR [DIR ...] --out REPORT``: the token-level entropy analysis of ``egpo.generate`` runs.

Per run: the distribution of every response token's entropy (percentiles, the 80th as the 80/20 threshold, the shares
below 0.01 and 0.1 nats), split by thought and answer and by correct and incorrect responses, along the thought, per
response, and per token id. Across runs (each against the first): percentile shifts with bootstrap intervals over
responses, the tokens that moved most, and for runs on the same responses (``egpo.generate --score``) the overlap of
their top-20% entropy positions. Writes ``analysis.json``, ``analysis.md``, PNG plots and ``index.html``.

:mod:`egpo.analyze.tokens` reads the runs, :mod:`egpo.analyze.stats` computes, :mod:`egpo.analyze.plots` and
:mod:`egpo.analyze.page` present.
"""

from __future__ import annotations

import json
from pathlib import Path


def make_decoder(runs):
    """Token id -> its text, by the first run's tokenizer that loads from this machine (each id decoded once);
    ``#id`` where none does (the analysis says so)."""
    from functools import lru_cache

    tokenizer = None
    for source in dict.fromkeys(run.run.get("tokenizer") for run in runs):
        if not source:
            continue
        try:  # a local folder or the hub's cache; never a download
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True)
            break
        except Exception:  # noqa: BLE001 - a tokenizer that does not load: the ids are shown instead, and said
            continue

    @lru_cache(maxsize=None)
    def decode(token_id: int) -> str:
        return f"#{token_id}" if tokenizer is None else tokenizer.decode([token_id], skip_special_tokens=False)

    decode.tokenizer = tokenizer
    return decode


def default_names(dirs: list[Path]) -> list[str]:
    """Each folder's name, with as many of its parents as tell it apart from the others
    (``grpo__seed0/generate_on_base`` beside ``egpo_rollout__seed0/generate_on_base``)."""
    parts = [Path(d).expanduser().resolve().parts for d in dirs]
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return names


def analyze(dirs: list[Path], out: Path, *, names: list[str] | None = None, solved_score: float = 1.0,
            min_count: int = 20, top: int = 20, resamples: int = 200, seed: int = 0, show: int = 8,
            plot: list[tuple[int, int]] = ()) -> dict:
    """The analysis of ``dirs`` into ``out``; ``show`` responses on the page (``plot``'s first, then one sample of
    each prompt in turn), ``plot``'s responses token by token (default: the first shown)."""
    from egpo.analyze.page import analysis_md, index_html, shown_keys
    from egpo.analyze.plots import write_plots
    from egpo.analyze.stats import compare, run_summary
    from egpo.analyze.tokens import load_run

    names = names or default_names(dirs)
    if len(set(names)) != len(names):
        names = [f"{i}:{n}" for i, n in enumerate(names)]
    runs = [load_run(Path(d), name) for d, name in zip(dirs, names)]
    for run in runs:
        if not len(run.entropy):
            raise SystemExit(f"[egpo] analyze: {run.path} holds no response tokens")
    decode = make_decoder(runs)
    analysis = {
        "runs": [run_summary(run, solved_score, min_count, top, decode) for run in runs],
        "comparisons": [compare(runs[0], run, resamples=resamples, seed=seed, min_count=min_count, top=top,
                                decode=decode) for run in runs[1:]],
        "tokenizer": None if decode.tokenizer is None else runs[0].run.get("tokenizer"),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.json").write_text(json.dumps(analysis, indent=1))
    picked = [tuple(key) for key in plot]
    missing = [f"{i}:{s}" for i, s in picked if all(r.row_of((i, s)) is None for r in runs)]
    if missing:
        raise SystemExit(f"[egpo] analyze: --plot {' '.join(missing)}: no run holds that response (prompt index:sample; "
                         f"the first run's prompts are 0 to {int(runs[0].index.max())}, samples 0 to "
                         f"{int(runs[0].sample.max())})")
    shown = shown_keys(runs, show, picked)
    plots = write_plots(out, runs, analysis, decode, responses=picked or shown[:1])
    (out / "analysis.md").write_text(analysis_md(analysis, plots))
    (out / "index.html").write_text(index_html(analysis, runs, plots, decode, show, picked))
    return analysis
