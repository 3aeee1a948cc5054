"""Turns an ablation directory into ``report.md`` with tables and PNG plots.

    python -m egpo.report DIR [--steps 10 30] [--window 5] [--baseline grpo] [--arms grpo egpo_rollout] [--out DIR2]

Reads every ``*.jsonl`` under DIR written by verl's file logger (``trainer.logger=[console,file]``: one
``{"step": n, "data": {metric: value}}`` line per step), from ``python -m egpo.ablation`` or from GPU runs. A run's
arm and seed come from a ``run.json`` beside its file, else from a file or folder name ``<arm>__seed<k>``, else the
file's name is the arm and the seed is 0. A step's value is the mean over the ``window`` steps ending there.

Tables: per arm at each chosen step, mean and spread (standard deviation, min, max) over seeds; the paired
per-seed difference of each arm from the baseline arm: mean, standard deviation, seeds where it is positive, a
bootstrap 95% interval of the mean, the exact Wilcoxon signed-rank p-value, that p-value Holm-adjusted over every
comparison in the report (a summary at the top lists what is significant before and after), and the seeds a paired
test would need for 80% power (:mod:`egpo.significance`). ``report.csv`` holds those comparisons, one row per metric, step and arm
(``metric, step, arm, baseline, n_seeds, mean_diff, ci_low, ci_high, p_value``, then ``sd, seeds_positive,
seeds_for_80pct_power, significant, p_holm, significant_holm``). Plots: per metric, the mean over seeds per arm with the min-max band, and
the paired difference from the baseline with its bootstrap 95% band. Needs matplotlib (``pip install -e '.[report]'``).

Validation metrics (``val-*``, logged every ``trainer.test_freq`` steps) are read at the last validation at or before a
step, not averaged over a window. pass@k (``val-egpo/pass@k``, :mod:`egpo.trainer.pass_at_k`): pass@1 and pass@n are
compared like every other metric, and a section gives every k per arm at the last step with its curve over k.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

from egpo.runs.ablation_dir import RUN_NAME as NAME  # a run folder's name: its arm and seed

METRICS = {
    "egpo/cot_entropy_mean": "CoT entropy (nats/token)",
    "egpo/response_entropy_mean": "response entropy (nats/token)",
    "actor/entropy": "actor entropy (nats/token)",
    "critic/score/mean": "reward",
    "egpo/think_closed_frac": "closed-thought fraction",
    "egpo/applied_bonus_mean": "bonus added to the advantage (lambda x bonus)",
    "egpo/bonus_active_frac": "fraction of advantages the bonus changed",
    "egpo/clipped_frac": "clipped fraction",
    "egpo/equal_reward_group_frac": "equal-reward group fraction",
    "egpo/cot_tokens_mean": "CoT length (tokens)",
    "egpo/entropy_rollout_vs_actor/max_abs_diff": "rollout vs actor entropy, max abs diff",
    "egpo/surprisal_vs_actor_entropy/mean_abs_diff": "surprisal vs actor entropy, mean abs diff",
    "egpo/token_selection/kept_frac": "kept token fraction (80/20 rule)",
}
PASS_AT_K = re.compile(r"^val-egpo/pass@(?P<k>\d+)$")  # the whole validation set's pass@k

Series = dict[int, dict[str, float]]  # step -> metrics


def read_metrics(path: Path) -> Series:
    steps: Series = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            values = {k: float(v) for k, v in record["data"].items() if isinstance(v, (int, float))}
            steps.setdefault(int(record["step"]), {}).update(values)
    return steps


def identify(path: Path) -> tuple[str, int]:
    from egpo.runs.state import RUN

    meta = path.parent / RUN
    if meta.exists():
        info = json.loads(meta.read_text())
        return info["arm"], int(info["seed"])
    for name in (path.stem, path.parent.name):
        match = NAME.match(name)
        if match:
            return match["arm"], int(match["seed"])
    from egpo.runs.state import METRICS_FILE

    return (path.parent.name if path.name == METRICS_FILE else path.stem), 0  # a main job's run directory


def load_runs(root: Path, left_out: list[str] | None = None) -> dict[str, dict[int, Series]]:
    """arm -> seed -> step -> metrics. An ablation run directory (``run.json``) counts once it finished
    (``done.json``); the names of the others go to ``left_out``. A running attempt's own file is never read."""
    from egpo.runs.state import ATTEMPT_METRICS, DONE, RUN

    runs: dict[str, dict[int, Series]] = defaultdict(dict)
    for path in sorted(root.rglob("*.jsonl")):
        if path.name == ATTEMPT_METRICS:
            continue
        if (path.parent / RUN).exists() and not (path.parent / DONE).exists():
            if left_out is not None:
                left_out.append(path.parent.name)
            continue
        series = read_metrics(path)
        if series:
            arm, seed = identify(path)
            runs[arm][seed] = series
    if not runs:
        raise SystemExit(no_runs_refusal(root, left_out))
    return dict(runs)


def no_runs_refusal(root: Path, left_out: list[str] | None) -> str:
    """Why a folder has nothing to report, and what to give instead."""
    from egpo.folders import GENERATION, MISSING, folder_kind, no_such_folder

    kind = folder_kind(root)
    if kind == MISSING:
        why = no_such_folder("", root)
    elif kind == GENERATION:
        why = (f"{root} is an egpo.generate run (samples, no training metrics): its tokens are read by python -m "
               f"egpo.analyze {root} --out {root / 'analysis'}")
    elif left_out:
        why = (f"no run under {root} has finished ({', '.join(sorted(left_out))}): python -m egpo.ablation --status "
               f"{root} shows where each is")
    else:
        why = (f"no finished run's metrics under {root} (metrics.jsonl, from verl's file logger): give a main job's run "
               "directory (trainer.default_local_dir, e.g. checkpoints/egpo/cpu_warm) or an egpo.ablation --out folder")
    return f"[egpo] report: {why}"


# logged at some steps only (validations; the generation after a run, at its last step): the value at a step is the
# latest logged in its window, none where none was (a validation is never carried into a window it did not run in)
SPARSE = ("val-", "token/")


def at_step(series: Series, metric: str, step: int, window: int) -> float | None:
    if metric.startswith(SPARSE):
        logged = [s for s in series if step - window < s <= step and metric in series[s]
                  and math.isfinite(series[s][metric])]
        return series[max(logged)][metric] if logged else None
    values = [series[s][metric] for s in range(step - window + 1, step + 1)
              if s in series and metric in series[s] and math.isfinite(series[s][metric])]
    return sum(values) / len(values) if values else None


def logged_steps(seeds: dict[int, Series], metric: str) -> list[int]:
    """The steps a metric is plotted at: every step, or for validation metrics the steps a validation logged it."""
    steps = {s for series in seeds.values() for s in series}
    if metric.startswith(SPARSE):
        steps = {s for series in seeds.values() for s, values in series.items() if metric in values}
    return sorted(steps)


def pass_at_k_metrics(runs) -> dict[int, str]:
    """k -> ``val-egpo/pass@k`` for every k some run logged."""
    found = {int(match["k"]): name for seeds in runs.values() for series in seeds.values() for values in series.values()
             for name in values if (match := PASS_AT_K.match(name))}
    return dict(sorted(found.items()))


def pass_at_k_section(runs, out: Path, step: int) -> list[str]:
    """Every k per arm at ``step`` (mean and spread over seeds), and the curve over k."""
    ks = pass_at_k_metrics(runs)
    if not ks:
        return []
    lines = [f"## pass@k at step {step} (`val-egpo/pass@k`, the last validation at or before it)", "",
             "| arm | seeds | " + " | ".join(f"pass@{k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
    curves = {}
    for arm, seeds in runs.items():
        cells, curve = [], []
        n_seeds = 0
        for k, metric in ks.items():
            values = seed_values(seeds, metric, step, 1)
            if values:
                mean, std = mean_std(values)
                cells.append(f"{_fmt(mean)} ± {_fmt(std)}")
                curve.append((k, mean, min(values), max(values)))
                n_seeds = max(n_seeds, len(values))
            else:
                cells.append("-")
        if curve:
            curves[arm] = curve
            lines.append(f"| {arm} | {n_seeds} | " + " | ".join(cells) + " |")
    lines += ["", "Mean ± standard deviation over seeds.", ""]
    png = out / "pass_at_k.png"
    if plot_pass_at_k(curves, png, step):
        lines[2:2] = [f"![pass@k]({png.name})", ""]
    return lines


def save_figure(fig, ax, out: Path, xlabel: str, ylabel: str, title: str) -> None:
    """The report's plots end alike: labels, a two-line title, the legend, saved as PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def plot_pass_at_k(curves: dict[str, list[tuple[int, float, float, float]]], out: Path, step: int) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for arm, curve in curves.items():
        ks, mean, low, high = zip(*curve)
        ax.plot(ks, mean, marker="o", label=arm)
        ax.fill_between(ks, low, high, alpha=0.15)
    ax.set_xscale("log", base=2)
    save_figure(fig, ax, out, "k (samples per problem)", "pass@k",
                f"pass@k at step {step}\nmean over seeds, min-max band")
    plt.close(fig)
    return True


def metric_titles(runs) -> dict[str, str]:
    """The metrics the report compares, in order: :data:`METRICS` that some run logged, then pass@1 and pass@n."""
    logged = {name for seeds in runs.values() for series in seeds.values() for values in series.values()
              for name in values}
    from egpo.analyze.run_figures import TOKEN_METRICS

    titles = {metric: title for metric, title in METRICS.items() if metric in logged}
    ks = pass_at_k_metrics(runs)
    for k in sorted({min(ks), max(ks)}) if ks else ():
        titles[ks[k]] = f"pass@{k} (validation)"
    titles.update({metric: title for metric, title in TOKEN_METRICS.items() if metric in logged})
    return titles


def analyze_hint(root: Path, runs, baseline: str) -> str:
    """The egpo.analyze command that compares, token by token, the base model's reading of its own responses with
    each arm's first seed's (the baseline's first), every run named."""
    from egpo.runs.ablation_dir import BASE_SCORED, ON_BASE, run_name
    from egpo.runs.state import DONE

    folders, names = [root / BASE_SCORED], ["base"]
    for arm in sorted(runs, key=lambda arm: arm != baseline):
        for seed in sorted(runs[arm]):
            folder = root / run_name(arm, seed) / ON_BASE
            if (folder / DONE).exists():
                folders.append(folder)
                names.append(run_name(arm, seed))
                break
    seed_word = "_".join(dict.fromkeys(name.rsplit("__", 1)[1] for name in names[1:])) or "runs"
    return (f"python -m egpo.analyze {' '.join(map(str, folders))} --names {' '.join(names)} "
            f"--out {root / ('tokens_' + seed_word)}")


def add_token_metrics(root: Path, runs) -> int:
    """Each finished ablation run's figures from ``egpo.ablation --generate`` (:mod:`egpo.analyze.run_figures`), as
    metrics at its last step; returns how many runs had them."""
    from egpo.analyze.run_figures import token_metrics
    from egpo.runs.state import DONE, RUN

    added = 0
    for meta in sorted(root.glob(f"*/{RUN}")):
        if not (meta.parent / DONE).exists():
            continue
        info = json.loads(meta.read_text())
        series = runs.get(info.get("arm"), {}).get(int(info.get("seed", -1)))
        if not series:
            continue
        found = token_metrics(root, meta.parent)
        if found:
            series[max(series)].update(found)
            added += 1
    return added


def seed_values(seeds: dict[int, Series], metric: str, step: int, window: int) -> list[float]:
    """One arm's value at ``step`` for every seed that has one."""
    return [v for v in (at_step(s, metric, step, window) for s in seeds.values()) if v is not None]


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def summary_table(runs, metric: str, steps: list[int], window: int) -> list[str]:
    lines = ["| arm | step | seeds | mean | std | min | max |", "|---|---|---|---|---|---|---|"]
    for arm, seeds in runs.items():
        for step in steps:
            values = seed_values(seeds, metric, step, window)
            if not values:
                if metric.startswith(SPARSE) and logged_steps(seeds, metric):  # the arm's, none in this window
                    lines.append(f"| {arm} | {step} | 0 | - | - | - | - |")
                continue
            mean, std = mean_std(values)
            lines.append(f"| {arm} | {step} | {len(values)} | {_fmt(mean)} | {_fmt(std)} | "
                         f"{_fmt(min(values))} | {_fmt(max(values))} |")
    return lines


def paired_differences(runs, metric: str, step: int, window: int, arm: str, baseline: str) -> list[float]:
    """arm - baseline at ``step``, per seed that both arms ran (paired by seed)."""
    base = runs.get(baseline, {})
    diffs = []
    for seed, series in sorted(runs[arm].items()):
        a, b = at_step(series, metric, step, window), at_step(base.get(seed, {}), metric, step, window)
        if a is not None and b is not None:
            diffs.append(a - b)
    return diffs


def comparisons(runs, metric: str, steps: list[int], window: int, baseline: str) -> list:
    """(arm, step, PairedComparison) for every arm but the baseline, at each step with paired seeds."""
    from egpo.significance import compare

    found = []
    for arm in runs:
        if arm == baseline:
            continue
        for step in steps:
            diffs = paired_differences(runs, metric, step, window, arm, baseline)
            if diffs:
                found.append((arm, step, compare(diffs)))
    return found


def paired_table(found: list, baseline: str, adjusted: list[float]) -> list[str]:
    """The table of :func:`comparisons`' results for one metric; ``adjusted``: their Holm-adjusted p-values."""
    lines = [f"| arm - {baseline} | step | paired seeds | mean diff | std | seeds > 0 | 95% CI (bootstrap) | "
             "p (signed-rank) | significant | p (Holm) | significant (Holm) | seeds for 80% power |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (arm, step, c), p_holm in zip(found, adjusted):
        if p_holm is None:
            lines.append(f"| {arm} | {step} | {c.n_seeds} | {_fmt(c.mean_diff)} | - | {c.seeds_positive}/{c.n_seeds} | "
                         f"{c.n_seeds} seed: no paired test | - | - | - | - | - |")
            continue
        power = "-" if c.seeds_for_80pct_power is None else str(c.seeds_for_80pct_power)
        lines.append(f"| {arm} | {step} | {c.n_seeds} | {_fmt(c.mean_diff)} | {_fmt(c.sd)} | "
                     f"{c.seeds_positive}/{c.n_seeds} | [{_fmt(c.ci_low)}, {_fmt(c.ci_high)}] | {c.p_value:.3g} | "
                     f"{'yes' if c.significant else 'no'} | {p_holm:.3g} | {'yes' if p_holm < 0.05 else 'no'} | "
                     f"{power} |")
    return lines


MIN_PAIRED_SEEDS = 2  # fewer: no paired test (one difference has no spread); none is counted or adjusted


def testable(comparison) -> bool:
    return comparison.n_seeds >= MIN_PAIRED_SEEDS


def holm_by_metric(found_by_metric: dict[str, list]) -> dict[str, list[float | None]]:
    """Holm's adjustment over the report's whole family of tested comparisons (every metric, step and arm with at
    least two paired seeds), per metric in the order of ``found_by_metric``; None where no test was possible."""
    from egpo.significance import holm

    flat = iter(holm([c.p_value for found in found_by_metric.values() for _, _, c in found if testable(c)]))
    return {metric: [next(flat) if testable(c) else None for _, _, c in found]
            for metric, found in found_by_metric.items()}


CSV_COLUMNS = ("metric", "step", "arm", "baseline", "n_seeds", "mean_diff", "ci_low", "ci_high", "p_value",
               "sd", "seeds_positive", "seeds_for_80pct_power", "significant", "p_holm", "significant_holm")


def write_csv(found_by_metric: dict[str, list], baseline: str, out: Path) -> int:
    """One row per metric, step and arm: the paired comparison with the baseline (:func:`comparisons` per metric).
    Returns the rows written."""
    import csv

    adjusted = holm_by_metric(found_by_metric)
    rows = 0
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_COLUMNS)
        for metric, found in found_by_metric.items():
            for (arm, step, c), p_holm in zip(found, adjusted[metric]):
                if p_holm is None:  # no paired test: the difference alone, every test column empty
                    writer.writerow([metric, step, arm, baseline, c.n_seeds, repr(c.mean_diff), "", "", "", "",
                                     c.seeds_positive, "", "", "", ""])
                else:
                    writer.writerow([metric, step, arm, baseline, c.n_seeds, repr(c.mean_diff), repr(c.ci_low),
                                     repr(c.ci_high), repr(c.p_value), repr(c.sd), c.seeds_positive,
                                     "" if c.seeds_for_80pct_power is None else c.seeds_for_80pct_power,
                                     int(c.significant), repr(p_holm), int(p_holm < 0.05)])
                rows += 1
    return rows


def plot_differences(runs, metric: str, title: str, out: Path, window: int, baseline: str) -> bool:
    """Per arm, the mean paired difference from the baseline at every step, with its bootstrap 95% band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from egpo.significance import bootstrap_ci

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn = False
    for arm in runs:
        if arm == baseline:
            continue
        steps = logged_steps(runs[arm], metric)
        xs, mean, low, high = [], [], [], []
        for step in steps:
            diffs = paired_differences(runs, metric, step, window, arm, baseline)
            if diffs:
                lo, hi = bootstrap_ci(diffs, resamples=2000)
                xs.append(step)
                mean.append(statistics.mean(diffs))
                low.append(lo)
                high.append(hi)
        if xs:
            ax.plot(xs, mean, label=arm)
            ax.fill_between(xs, low, high, alpha=0.15)
            drawn = True
    if drawn:
        ax.axhline(0.0, color="black", linewidth=0.8)
        save_figure(fig, ax, out, "step", f"{title}: arm - {baseline}",
                    f"{title}, paired difference from {baseline}\nmean over seeds, bootstrap 95% band, "
                    f"{window}-step window")
    plt.close(fig)
    return drawn


def plot(runs, metric: str, title: str, out: Path, window: int) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn = False
    for arm, seeds in runs.items():
        steps = logged_steps(seeds, metric)
        xs, mean, low, high = [], [], [], []
        for step in steps:
            values = seed_values(seeds, metric, step, window)
            if values:
                xs.append(step)
                mean.append(statistics.mean(values))
                low.append(min(values))
                high.append(max(values))
        if xs:
            ax.plot(xs, mean, label=f"{arm} ({len(seeds)} seed{'' if len(seeds) == 1 else 's'})")
            ax.fill_between(xs, low, high, alpha=0.15)
            drawn = True
    if drawn:
        save_figure(fig, ax, out, "step", title, f"{title}\nmean over seeds, min-max band, {window}-step window")
    plt.close(fig)
    return drawn


def significance_summary(found_by_metric: dict[str, list], adjusted: dict[str, list[float]], baseline: str) -> list[str]:
    """Which differences from the baseline are significant, before and after Holm's correction."""
    total = sum(p is not None for ps in adjusted.values() for p in ps)
    untested = sum(len(found) for found in found_by_metric.values()) - total
    if not total:
        return ["## Significance", "",
                f"No paired test: every comparison with `{baseline}` has a single paired seed (a test needs at least "
                f"{MIN_PAIRED_SEEDS} seeds; the exact signed-rank test can reach 5% only from 6). The differences "
                "below are one seed's.", ""]
    raw, kept = [], []
    for metric, found in found_by_metric.items():
        for (arm, step, c), p_holm in zip(found, adjusted[metric]):
            if p_holm is not None and c.significant:
                item = f"`{metric}` {arm} step {step} ({_fmt(c.mean_diff)}, p={c.p_value:.3g})"
                raw.append(item)
                if p_holm < 0.05:
                    kept.append(f"{item[:-1]}, Holm p={p_holm:.3g})")
    lines = ["## Significance", "",
             f"{total} paired comparisons with `{baseline}` (every metric, step and arm below). Significant at 5% "
             f"by the signed-rank test: {len(raw)}" + (f" ({'; '.join(raw)})" if raw else "") + f". At 5% chance "
             f"alone would give about {0.05 * total:.1f} of {total}. After Holm's correction over all {total}: "
             + (f"{len(kept)} ({'; '.join(kept)})" if kept else "none") + "."
             + (f" {untested} comparison(s) with a single paired seed were not tested." if untested else ""), ""]
    return lines


def compared_lines(root: Path, runs) -> list[str]:
    """What the report compares, from the runs' ``run.json`` (an ablation's): recipe, steps, seeds, each arm's
    overrides, the ablation's own, and the versions installed where it ran. Nothing for runs without one."""
    infos = [json.loads(path.read_text()) for path in sorted(root.glob("*/run.json"))]
    infos = [info for info in infos if info.get("arm") in runs]
    if not infos:
        return []

    def distinct(key):
        return sorted({json.dumps(info.get(key), sort_keys=True) for info in infos if info.get(key) is not None})

    lines = ["## What was compared", ""]
    recipes, steps = [json.loads(r) for r in distinct("recipe")], [json.loads(s) for s in distinct("steps")]
    seeds = sorted({seed for arm_seeds in runs.values() for seed in arm_seeds})
    lines.append(f"- recipe {', '.join(f'`{r}`' for r in recipes) or 'not recorded'}, "
                 f"{' / '.join(map(str, steps))} steps, seeds {', '.join(map(str, seeds))}")
    by_arm = {info["arm"]: info.get("arm_overrides") for info in infos}
    lines.append("- arms: " + "; ".join(f"`{arm}`: " + (" ".join(by_arm[arm]) if by_arm.get(arm) else
                                                         "the recipe as it is") for arm in runs))
    common = [json.loads(o) for o in distinct("overrides")]
    lines.append("- the ablation's overrides: " + ("; ".join(" ".join(o) or "none" for o in common) or "none"))
    for versions in (json.loads(v) for v in distinct("versions")):
        lines.append("- installed: " + ", ".join(f"{name} {v}" for name, v in versions.items() if v) +
                     (f" ({', '.join(n for n, v in versions.items() if not v)} not installed)"
                      if any(not v for v in versions.values()) else ""))
    return lines + [""]


def only_arms(runs, left_out: list[str], arms: list[str], baseline: str, root: Path):
    """The runs of ``arms`` alone, in that order, and the unfinished ones among them: a report on part of an
    ablation (its own Holm family). An arm without finished runs, or a baseline outside ``arms``, is refused."""
    missing = [arm for arm in arms if arm not in runs]
    if missing:
        raise SystemExit(f"[egpo] report: no finished runs of {', '.join(missing)} under {root}; its arms: {', '.join(sorted(runs))}")
    if len(arms) > 1 and baseline not in arms:
        raise SystemExit(f"the baseline {baseline!r} is not among --arms {' '.join(arms)}: add it to --arms, or name "
                         f"one of them with --baseline")
    kept = [name for name in left_out if (m := NAME.match(name)) and m["arm"] in arms]
    return {arm: runs[arm] for arm in arms}, kept


def write_report(root: Path, steps: list[int] | None = None, window: int = 5, baseline: str = "grpo",
                 arms: list[str] | None = None, out: Path | None = None) -> Path:
    """``report.md``, ``report.csv`` and the plots in ``out`` (default: ``root``), of every arm under ``root`` or
    of ``arms`` only."""
    left_out: list[str] = []
    runs = load_runs(root, left_out)
    if arms:
        runs, left_out = only_arms(runs, left_out, arms, baseline, root)
    out = root if out is None else out
    out.mkdir(parents=True, exist_ok=True)
    generated = add_token_metrics(root, runs)
    last = max(s for seeds in runs.values() for series in seeds.values() for s in series)
    steps = steps or sorted({max(1, last // 2), last})
    kind = "ablation report" if len(runs) > 1 or any(len(seeds) > 1 for seeds in runs.values()) else "report"
    lines = [f"# EGPO {kind}: {root}", "",
             "Runs: " + ", ".join(f"{arm} ({len(seeds)} seed{'s' * (len(seeds) != 1)})"
                                  for arm, seeds in runs.items()) +
             f". Values at a step are means over the {window} steps ending there (a validation's: the latest in "
             "those steps, - where none ran); spread is over seeds.", ""]
    if left_out:
        lines += [f"Left out, not finished (`python -m egpo.ablation --status {root}`): {', '.join(sorted(left_out))}.",
                  ""]
    lines += compared_lines(root, runs)
    if generated:
        lines += [f"Token figures (`token/*`, `egpo.ablation --generate`) for {generated} run(s): each run's last "
                  "checkpoint sampled the validation prompts (`<run>/generate`) and read the base model's responses "
                  "(`<run>/generate_on_base`, against the base model's own reading of them, `generate_base_scored`); "
                  f"the tokens themselves, each arm's first seed on the base model's responses: `{analyze_hint(root, runs, baseline)}`.", ""]
    titles = metric_titles(runs)
    present = list(titles)
    compared = baseline in runs and len(runs) > 1
    found_by_metric = {metric: comparisons(runs, metric, steps, window, baseline) for metric in present} \
        if compared else {}
    adjusted = holm_by_metric(found_by_metric)
    if compared:
        lines += significance_summary(found_by_metric, adjusted, baseline)
    for metric in present:
        title = titles[metric]
        lines += [f"## {title} (`{metric}`)", ""]
        png = out / f"{metric.replace('/', '_')}.png"
        if not metric.startswith("token/") and plot(runs, metric, title, png, window):
            lines += [f"![{title}]({png.name})", ""]
        lines += summary_table(runs, metric, steps, window) + [""]
        if compared:
            lines += [f"Paired per-seed differences from `{baseline}` (95% bootstrap interval of the mean; exact "
                      "Wilcoxon signed-rank p-value, significant below 0.05, and Holm-adjusted over every comparison "
                      "in this report; seeds a paired test would need to see this difference at 80% power):", ""]
            diff_png = out / f"{metric.replace('/', '_')}_diff.png"
            if not metric.startswith("token/") and plot_differences(runs, metric, title, diff_png, window, baseline):
                lines += [f"![{title}, difference from {baseline}]({diff_png.name})", ""]
            lines += paired_table(found_by_metric[metric], baseline, adjusted[metric]) + [""]
    lines += pass_at_k_section(runs, out, steps[-1])
    if compared:
        rows = write_csv(found_by_metric, baseline, out / "report.csv")
        lines += [f"`report.csv`: the {rows} paired comparisons above, one row per metric, step and arm.", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m egpo.report", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("dir", type=Path)
    parser.add_argument("--steps", type=int, nargs="+", default=None, help="steps to tabulate (default: middle, last)")
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--baseline", default="grpo")
    parser.add_argument("--arms", nargs="+", default=None,
                        help="report these arms only, in this order (the baseline among them): their own comparisons "
                             "and Holm family (default: every arm under DIR)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for report.md, report.csv and the plots (default: DIR)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    print(f"report: {write_report(args.dir, args.steps, args.window, args.baseline, args.arms, args.out)}")


if __name__ == "__main__":
    main()
