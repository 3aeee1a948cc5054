"""``python -m egpo.analyze``: see :mod:`egpo.analyze`."""

from __future__ import annotations

import argparse
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    from egpo import analyze

    parser = argparse.ArgumentParser(prog="python -m egpo.analyze", allow_abbrev=False,
                                     description=" ".join(analyze.__doc__.split("\n\n")[1].split()))
    parser.add_argument("runs", nargs="+", type=Path, help="egpo.generate folders; each is compared to the first")
    parser.add_argument("--out", required=True, type=Path, help="the report's folder")
    parser.add_argument("--names", nargs="+", default=None, help="a name per run (default: the folders' names)")
    parser.add_argument("--solved-score", type=float, default=1.0, help="a response is correct at this score or above")
    parser.add_argument("--min-count", type=int, default=20, help="a token's mean entropy is listed from this count")
    parser.add_argument("--top", type=int, default=20, help="tokens listed per table")
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples of responses")
    parser.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    parser.add_argument("--show", type=int, default=8,
                        help="responses shown per run in index.html: one sample of each prompt in turn")
    parser.add_argument("--plot", nargs="+", type=response_key, default=[], metavar="INDEX:SAMPLE",
                        help="responses plotted token by token, a panel per run (default: the first shown), and "
                             "shown first on the page; e.g. --plot 3:0 5:1")
    return parser


def response_key(text: str) -> tuple[int, int]:
    """``INDEX:SAMPLE`` (a prompt's row in the data set, and its sample) as a pair of ints."""
    index, sep, sample = text.partition(":")
    if not sep or not index.isdigit() or not sample.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: give a response as INDEX:SAMPLE, e.g. 3:0")
    return int(index), int(sample)


def folder_problems(run: Path) -> list[str]:
    """A run folder that is not an egpo.generate run: missing (with the sibling meant), or a training run's or an
    ablation's folder, with what to run on it instead."""
    from egpo.folders import ABLATION, MISSING, TRAINING, folder_kind, generate_from, no_such_folder

    kind = folder_kind(run)
    if kind == MISSING:
        return [no_such_folder("", run)]
    if kind == TRAINING:
        return [f"{run} is a training run's folder, not an egpo.generate run: its report is python -m egpo.report "
                f"{run}; for its tokens, sample from its checkpoint first ({generate_from(run)}) and analyze that "
                "folder"]
    if kind == ABLATION:
        return [f"{run} is an ablation's folder: its report is python -m egpo.report {run}; its generations "
                f"(egpo.ablation --generate) are {run}/generate_base_scored and {run}/<run>/generate_on_base"]
    return []


def main(argv: list[str] | None = None) -> None:
    import time

    from egpo.analyze import analyze
    from egpo.errors import EgpoError

    args = parser().parse_args(argv)
    if args.names and len(args.names) != len(args.runs):
        raise SystemExit(f"[egpo] analyze: --names gives {len(args.names)} names for {len(args.runs)} runs")
    problems = [problem for run in args.runs for problem in folder_problems(run)]
    if problems:
        raise SystemExit("[egpo] analyze: " + "; ".join(problems))
    started = time.monotonic()
    try:
        analysis = analyze(args.runs, args.out, names=args.names, solved_score=args.solved_score,
                           min_count=args.min_count, top=args.top, resamples=args.bootstrap, seed=args.seed,
                           show=args.show, plot=args.plot)
    except EgpoError as err:
        raise SystemExit(f"[egpo] analyze: {err}") from None
    tokens = sum(r["tokens"] for r in analysis["runs"])
    print(f"[egpo] analyze: {len(analysis['runs'])} run(s), {tokens:,} tokens in {time.monotonic() - started:.1f} s; "
          f"{args.out}/index.html, analysis.md, analysis.json", flush=True)


if __name__ == "__main__":
    main()
