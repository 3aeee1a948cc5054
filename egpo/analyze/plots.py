"""The analysis's PNG plots (matplotlib, ``pip install -e '.[report]'``; without it the analysis has no plots and
says so)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from egpo.analyze.tokens import RunTokens


FORKS_LABELLED = 5  # the highest-entropy tokens of a response named on its plot


def position_plot_name(key: tuple[int, int]) -> str:
    return f"response_{key[0]}_{key[1]}_entropy_along_position.png"


def fitted(title: str, width: int = 90) -> str:
    """A panel title wrapped to the figure's width."""
    import textwrap

    return "\n".join(textwrap.wrap(title, width)) or title


def position_figure(plt, runs: list[RunTokens], analysis: dict, key: tuple[int, int], decode):
    """One response (``key``: its prompt's index and its sample) token by token, a panel per run that holds it, on
    one y scale; the forking tokens (Wang et al.) are those at or above the run's 80th percentile. None: no run
    holds it."""
    shown = [(run, summary, run.row_of(key)) for run, summary in zip(runs, analysis["runs"])]
    shown = [(run, summary, row) for run, summary, row in shown if row is not None]
    if not shown:
        return None
    fig, axes = plt.subplots(len(shown), 1, figsize=(9, 2.4 * len(shown) + 0.6), squeeze=False, sharey=True)
    for ax, (run, summary, row) in zip(axes[:, 0], shown):
        entropy = run.entropy[run.offsets[row]:run.offsets[row + 1]]
        tokens = run.token_id[run.offsets[row]:run.offsets[row + 1]]
        threshold = summary["percentiles"]["80"]
        ax.plot(np.arange(len(entropy)), entropy, linewidth=0.8, color="tab:blue")
        if threshold is not None:
            ax.axhline(threshold, linestyle=":", color="grey")
            forks = np.flatnonzero(entropy >= threshold)
            ax.scatter(forks, entropy[forks], s=12, color="tab:red", zorder=3)
            for i in forks[np.argsort(-entropy[forks], kind="stable")][:FORKS_LABELLED]:
                ax.annotate(repr(decode(int(tokens[i]))), (i, entropy[i]), fontsize=7,
                            xytext=(2, 4), textcoords="offset points")
        mean = float(entropy.mean()) if len(entropy) else float("nan")
        ax.set_title(fitted(f"{run.name}: mean {mean:.3f} nats over {len(entropy)} tokens"), fontsize=9)
        ax.set_ylabel("entropy (nats)")
    axes[-1, 0].set_xlabel("position in the response (tokens)")
    fig.suptitle(f"prompt {key[0]}, sample {key[1]}: each token's entropy", fontsize=10)
    fig.text(0.5, 0.005, "dotted: the run's 80th percentile; red: the tokens at or above it", ha="center", fontsize=8)
    return fig


def write_plots(out: Path, runs: list[RunTokens], analysis: dict, decode=lambda token_id: f"#{token_id}",
                responses: list[tuple[int, int]] = ()) -> list[str]:
    """The PNG files written into ``out`` (names relative to it); [] without matplotlib. ``responses``: the
    (index, sample) of each response plotted token by token."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written = []

    def save(fig, name, rect=(0, 0, 1, 1)):
        fig.tight_layout(rect=rect)
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    top = max((float(r.entropy.max()) for r in runs if len(r.entropy)), default=1.0) or 1.0
    edges = np.linspace(0, top, 61)
    fig, ax = plt.subplots(figsize=(7, 4))
    for run, summary in zip(runs, analysis["runs"]):
        _, _, patches = ax.hist(run.entropy, bins=edges, histtype="step", density=True, label=run.name)
        if summary["percentiles"]["80"] is not None:  # in the run's own colour
            ax.axvline(summary["percentiles"]["80"], linestyle=":", color=patches[0].get_edgecolor())
    ax.set_yscale("log")
    ax.set(xlabel="token entropy (nats)", ylabel="density (log)", title="Token entropy (dotted: 80th percentile)")
    ax.legend()
    save(fig, "entropy_distribution.png")

    profiles = [(s["name"], s["thought_profile"]) for s in analysis["runs"] if s["thought_profile"]]
    if profiles:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, profile in profiles:
            centres = (np.arange(profile["bins"]) + 0.5) / profile["bins"]
            values = [np.nan if v is None else v for v in profile["mean_entropy"]]
            ax.plot(centres, values, marker="o", label=name)
        ax.set(xlabel="relative position in the thought", ylabel="mean token entropy (nats)",
               title="Entropy along the thought")
        ax.legend()
        save(fig, "entropy_along_thought.png")

    for key in responses:
        fig = position_figure(plt, runs, analysis, key, decode)
        if fig is not None:
            save(fig, position_plot_name(key), rect=(0, 0.03, 1, 1))

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        ax.scatter(run.lengths, run.row_means(), s=8, alpha=0.6, label=run.name)
    ax.set(xlabel="response length (tokens)", ylabel="mean token entropy (nats)", title="Per response")
    ax.legend()
    save(fig, "response_entropy_vs_length.png")

    if analysis["comparisons"]:
        fig, ax = plt.subplots(figsize=(7, 4))
        for c in analysis["comparisons"]:
            qs = [int(q) for q in c["shift"]["percentiles"]]
            shift = np.array([v["shift"] for v in c["shift"]["percentiles"].values()])
            low = np.array([v["low"] for v in c["shift"]["percentiles"].values()])
            high = np.array([v["high"] for v in c["shift"]["percentiles"].values()])
            # a percentile-bootstrap interval need not contain the estimate: the bars end at it then
            ax.errorbar(qs, shift, yerr=[np.clip(shift - low, 0, None), np.clip(high - shift, 0, None)], marker="o",
                        capsize=3,
                        label=f"{c['b']} - {c['a']}")
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set(xlabel="percentile", ylabel="shift (nats)", title="Percentile shifts, bootstrap intervals")
        ax.legend()
        save(fig, "percentile_shift.png")
    return written
