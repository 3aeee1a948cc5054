"""``index.html`` and ``analysis.md``: the analysis for a reader.

The page shows a sample of responses with every response token in a ``<span class="tok">`` coloured by its entropy
(its value on hover, the scale drawn above them), the plots, and, for runs on the same responses, each shown response
side by side under every run's entropy. The rows shown are one sample of each prompt in turn (those picked with
``--plot`` first), the same rows for every run that holds them.
"""

from __future__ import annotations

import html
import json

import numpy as np

from egpo.analyze.stats import PERCENTILES
from egpo.analyze.tokens import RunTokens, prompt_texts, reads_another_runs_tokens

# where a run reads another run's responses (egpo.generate --score): what its shift means
SCORED_SHIFT = ("A run that scores another run's responses reads tokens it did not sample: its entropy there is the "
                "entropy of its own distribution at positions another policy chose. A trained checkpoint's entropy on "
                "the base model's tokens can rise while the CoT entropy of training's own samples falls: the "
                "checkpoint is less sure where the base model went than where it goes itself.")

STYLE = """
body { font-family: sans-serif; max-width: 1200px; margin: 1em auto; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 6px; vertical-align: top; }
.resp { font-family: monospace; white-space: pre-wrap; line-height: 1.6; }
.tok { border-radius: 2px; }
.prompt { color: #555; font-size: 90%; white-space: pre-wrap; } .score { font-weight: bold; margin: 2px 0; }
.mean { margin: 2px 0; }
.legend { width: 420px; margin: 0.5em 0 1.5em; } .legend .bar { height: 14px; border: 1px solid #999; }
.legend .ticks { position: relative; height: 1.2em; font-size: 80%; } .legend .unit { font-size: 80%; color: #555; }
img { max-width: 100%; }
"""


def token_colour(entropy: float, scale: float) -> str:
    """White (0 nats) to red (``scale`` nats and above)."""
    share = 0.0 if scale <= 0 else min(1.0, max(0.0, entropy / scale))
    fade = int(round(255 * (1 - share)))
    return f"rgb(255,{fade},{fade})"


def verdict(score: float, solved_score: float) -> str:
    if not np.isfinite(score):
        return "no score"
    return f"score {score:g}, " + ("correct" if score >= solved_score else "incorrect")


def shown_row_html(run: RunTokens, row: int, decode, scale: float, prompts: dict, solved_score: float) -> str:
    """A shown response under its prompt, its score and its mean entropy."""
    key = (int(run.index[row]), int(run.sample[row]))
    prompt = prompts.get(key)
    lo, hi = run.offsets[row], run.offsets[row + 1]
    mean = float(run.entropy[lo:hi].mean()) if hi > lo else float("nan")
    head = (f'<div class="prompt">prompt {key[0]}, sample {key[1]}: {html.escape(prompt) if prompt else ""}</div>'
            f'<div class="score">{verdict(float(run.score[row]), solved_score)}</div>'
            f'<div class="mean">mean entropy {mean:.4f} nats over {hi - lo} tokens</div>')
    return head + response_html(run, row, decode, scale)


def colour_legend(scale: float) -> str:
    """The colour scale, drawn: a white-to-red bar with its values."""
    stops = ", ".join(token_colour(scale * k / 4, scale) for k in range(5))
    ticks = "".join(f'<span style="position:absolute; left:{25 * k}%; transform:translateX(-50%)">'
                    f'{scale * k / 4:.2f}</span>' for k in range(5))
    return (f'<div class="legend"><div class="bar" style="background:linear-gradient(to right, {stops})"></div>'
            f'<div class="ticks">{ticks}</div><div class="unit">token entropy (nats); {scale:.2f} and above: the '
            "reddest</div></div>")


def response_html(run: RunTokens, row: int, decode, scale: float) -> str:
    lo, hi = run.offsets[row], run.offsets[row + 1]
    spans = [f'<span class="tok" style="background-color:{token_colour(h, scale)}" title="{h:.4f} nats">'
             f'{html.escape(decode(int(t)))}</span>'
             for t, h in zip(run.token_id[lo:hi].tolist(), run.entropy[lo:hi].tolist())]
    return (f'<div class="resp" data-run="{html.escape(run.name)}" data-index="{int(run.index[row])}" '
            f'data-sample="{int(run.sample[row])}">{"".join(spans)}</div>')


def shown_keys(runs: list[RunTokens], count: int, first: list[tuple[int, int]] = ()) -> list[tuple[int, int]]:
    """``count`` (index, sample) rows every run holds: ``first``'s, then one sample of each prompt in turn (every
    prompt's sample 0, then every prompt's sample 1, ...), so the page shows several prompts, not one prompt's
    samples."""
    common = set(zip(runs[0].index.tolist(), runs[0].sample.tolist()))
    for run in runs[1:]:
        common &= set(zip(run.index.tolist(), run.sample.tolist()))
    picked = [key for key in first if key in common]
    rest = sorted(common - set(picked), key=lambda key: (key[1], key[0]))
    return (picked + rest)[:max(count, len(picked))]


def index_html(analysis: dict, runs: list[RunTokens], plots: list[str], decode, show: int,
               first: list[tuple[int, int]] = ()) -> str:
    scale = max(float(np.percentile(r.entropy, 99)) if len(r.entropy) else 0.0 for r in runs) or 1.0
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>Token entropy</title><style>{STYLE}</style>"
             "</head><body><h1>Token entropy</h1>",
             "<table><tr><th>run</th><th>responses</th><th>tokens</th><th>mean</th><th>p50</th>"
             "<th>p80 (80/20 threshold)</th><th>p95</th><th>below 0.01</th><th>below 0.1</th></tr>"]
    for s in analysis["runs"]:
        p = s["percentiles"]
        cells = [s["name"], s["responses"], s["tokens"], _num(s["mean"]), _num(p["50"]), _num(p["80"]),
                 _num(p["95"]), _num(s["frac_below_0.01"]), _num(s["frac_below_0.1"])]
        parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    parts.append("</table>")
    parts += [f'<h2>{html.escape(p.rsplit(".", 1)[0].replace("_", " "))}</h2><img src="{html.escape(p)}">'
              for p in plots]
    keys = shown_keys(runs, show, first)
    solved = {s["name"]: s["solved_score"] for s in analysis["runs"]}
    parts.append(f"<h2>Responses</h2><p>Each response under its prompt, its score and its mean entropy, every token "
                 f"coloured by its entropy, white 0 to red {scale:.2f} nats (the runs' 99th percentile) and above; "
                 "hover for the value.</p>" + colour_legend(scale))
    for group in _paired_groups(runs):
        if len(group) > 1:
            prompts = prompt_texts(group[0].path, set(keys))
            parts.append("<h3>" + " | ".join(html.escape(r.name) for r in group) + " (same responses)</h3>")
            if any(reads_another_runs_tokens(r) for r in group):
                parts.append(f"<p>{html.escape(SCORED_SHIFT)}</p>")
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(r.name)}</th>" for r in group) + "</tr>")
            for key in keys:
                parts.append("<tr>" + "".join(
                    f"<td>{shown_row_html(r, r.row_of(key), decode, scale, prompts, solved[r.name])}</td>"
                    for r in group) + "</tr>")
            parts.append("</table>")
        else:
            run = group[0]
            parts.append(f"<h3>{html.escape(run.name)}</h3>")
            own = shown_keys([run], show, first)
            prompts = prompt_texts(run.path, set(own))
            parts += [shown_row_html(run, run.row_of(key), decode, scale, prompts, solved[run.name]) + "<hr>"
                      for key in own]
    parts.append("</body></html>")
    return "\n".join(parts)


def _paired_groups(runs: list[RunTokens]) -> list[list[RunTokens]]:
    groups: dict = {}
    for run in runs:
        groups.setdefault(run.run.get("responses_id") or id(run), []).append(run)
    return list(groups.values())


def _num(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def _split_row(label: str, d: dict | None) -> str:
    if not d or not d.get("tokens"):
        return f"| {label} | 0 | - | - | - | - | - |"
    p = d["percentiles"]
    return (f"| {label} | {d['tokens']} | {_num(d['mean'])} | {_num(p['50'])} | {_num(p['80'])} | "
            f"{_num(d['frac_below_0.01'])} | {_num(d['frac_below_0.1'])} |")


def analysis_md(analysis: dict, plots: list[str]) -> str:
    lines = ["# Token entropy", "", f"Runs: {', '.join(s['name'] for s in analysis['runs'])}. Entropy in nats per "
             "response token; the 80th percentile is the 80/20 rule's threshold. Every number below is in "
             "analysis.json.", ""]
    for s in analysis["runs"]:
        lines += [f"## {s['name']}", "",
                  f"{s['mode']} run of `{s['model']}`" + (f", checkpoint `{s['checkpoint']}`" if s["checkpoint"] else "")
                  + f"; entropy of {json.dumps(s['entropy_of'])}; {s['responses']} responses.", "",
                  "| tokens | " + " | ".join(f"p{q}" for q in PERCENTILES) + " | mean | below 0.01 | below 0.1 |",
                  "|---" * (len(PERCENTILES) + 4) + "|",
                  f"| {s['tokens']} | " + " | ".join(_num(s["percentiles"][str(q)]) for q in PERCENTILES)
                  + f" | {_num(s['mean'])} | {_num(s['frac_below_0.01'])} | {_num(s['frac_below_0.1'])} |", "",
                  "| tokens of | count | mean | p50 | p80 | below 0.01 | below 0.1 |", "|---|---|---|---|---|---|---|",
                  _split_row("all", s), _split_row("the thought", s["thought"]), _split_row("the answer", s["answer"]),
                  _split_row(f"correct responses (score >= {s['solved_score']:g})", s["correct"]),
                  _split_row("incorrect responses", s["incorrect"]), ""]
        if s["thought"] is None:
            lines += ["No thinking markers in this run's tokenizer: no thought/answer split.", ""]
        per = s["per_response"]
        lines += [f"Per response: mean entropy's correlation with length {_num(per['corr_mean_entropy_length'])}, "
                  f"with score {_num(per['corr_mean_entropy_score'])}.", ""]
        for key, title in (("top_high", "highest"), ("top_low", "lowest")):
            lines += [f"Tokens with the {title} mean entropy (seen at least {s['min_count']} times):", "",
                      "| token | id | mean entropy | count |", "|---|---|---|---|"]
            lines += [f"| `{t['text']!r}` | {t['token_id']} | {t['mean_entropy']:.4f} | {t['count']} |" for t in s[key]]
            lines.append("")
    for c in analysis["comparisons"]:
        shift = c["shift"]
        lines += [f"## {c['b']} against {c['a']}", "",
                  ("The same responses (a paired bootstrap)." if c["paired"] else "Different responses.")
                  + (f" {SCORED_SHIFT}" if c.get("scored") else "")
                  + f" {shift['resamples']} bootstrap resamples of responses, {int(shift['confidence'] * 100)}% "
                  "intervals." + ("" if c["same_entropy_definition"] else
                                  " **The two runs' entropies are of different distributions** (see entropy_of)."), "",
                  "| | shift | interval |", "|---|---|---|",
                  f"| mean | {shift['mean']['shift']:+.4f} | [{shift['mean']['low']:+.4f}, {shift['mean']['high']:+.4f}] |"]
        lines += [f"| p{q} | {v['shift']:+.4f} | [{v['low']:+.4f}, {v['high']:+.4f}] |"
                  for q, v in shift["percentiles"].items()]
        lines.append("")
        if c["top20_overlap"]:
            o = c["top20_overlap"]
            lines += [f"Top-20% entropy positions: {o['both']} of {c['a']}'s {o['top_a']} are in {c['b']}'s top 20% "
                      f"too (overlap {o['overlap']:.3f}; chance {o['chance']}).", ""]
        lines += ["Tokens whose mean entropy moved most:", "", f"| token | id | {c['a']} | {c['b']} | shift |",
                  "|---|---|---|---|---|"]
        lines += [f"| `{t['text']!r}` | {t['token_id']} | {t['mean_entropy_a']:.4f} | {t['mean_entropy_b']:.4f} | "
                  f"{t['shift']:+.4f} |" for t in c["token_moves"]]
        lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots]
    else:
        lines += ["No plots: matplotlib is not installed (pip install -e '.[report]')."]
    return "\n".join(lines) + "\n"
