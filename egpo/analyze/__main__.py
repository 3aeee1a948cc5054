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
    parser.add_argument("--show", type=int, default=8, help="responses shown per run in index.html")
    return parser


def main(argv: list[str] | None = None) -> None:
    import time

    from egpo.analyze import analyze
    from egpo.errors import EgpoError

    args = parser().parse_args(argv)
    if args.names and len(args.names) != len(args.runs):
        raise SystemExit(f"[egpo] analyze: --names gives {len(args.names)} names for {len(args.runs)} runs")
    started = time.monotonic()
    try:
        analysis = analyze(args.runs, args.out, names=args.names, solved_score=args.solved_score,
                           min_count=args.min_count, top=args.top, resamples=args.bootstrap, seed=args.seed,
                           show=args.show)
    except EgpoError as err:
        raise SystemExit(f"[egpo] analyze: {err}") from None
    tokens = sum(r["tokens"] for r in analysis["runs"])
    print(f"[egpo] analyze: {len(analysis['runs'])} run(s), {tokens:,} tokens in {time.monotonic() - started:.1f} s; "
          f"{args.out}/index.html, analysis.md, analysis.json", flush=True)


if __name__ == "__main__":
    main()
