"""``python -m egpo.rehearse``: a recipe's own run, whole, on this CPU, before a GPU is booked.

    python -m egpo.rehearse --config-path="$PWD/recipes" --config-name=qwen3_4b algorithm.entropy_source=rollout

It composes what ``python -m egpo.main`` would run with the same arguments, changes only what a CPU cannot hold
(:mod:`egpo.rehearse.plan`: each change printed with the recipe's value, the rehearsal's and why), runs the real main
job with those changes in a run folder of its own (the recipe's experiment name plus ``_rehearsal``: the same
refusals, console and closing summary as the real run), then says, one line per event of the schedule, whether the
run held it (the step-0 validation, the training steps, the saves, the validations on save steps, the last step's
save) with its seconds, and the preflight's checkpoint size beside the one on disk. Exit status: the run's, else 1
where an event did not hold.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: the recipes and the committed warm demo


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m egpo.rehearse", allow_abbrev=False,
                                     description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--config-path", default=None, help="a recipe folder (default: egpo's own configs)")
    parser.add_argument("--config-name", default="egpo_trainer")
    parser.add_argument("--dry-run", action="store_true", help="print the changes and the command; run nothing")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m egpo.main")
    return parser


def refuse(message: str) -> SystemExit:
    return SystemExit(f"[egpo] rehearse refused before anything started: {message}")


def main(argv: list[str] | None = None) -> None:
    from egpo.errors import EgpoError
    from egpo.preflight.compose import compose
    from egpo.rehearse.plan import plan

    args = parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    try:
        recipe = compose(args.config_path, args.config_name, list(args.overrides))
    except EgpoError as err:
        raise refuse(str(err)) from None
    changes = plan(recipe, ROOT)
    experiment = f"{recipe.trainer.experiment_name}_rehearsal"
    overrides = [*args.overrides, *(c.override() for c in changes), f"trainer.experiment_name={experiment}"]
    print(f"[rehearse] {args.config_name} on this CPU: {len(changes)} change(s), everything else the recipe's", flush=True)
    for change in changes:
        print(f"[rehearse] {change.line().strip()}", flush=True)
    command = [sys.executable, "-m", "egpo.main", *([f"--config-path={args.config_path}"] if args.config_path else []),
               f"--config-name={args.config_name}", *overrides]
    if args.dry_run:
        print("[rehearse] the run: " + " ".join(command), flush=True)
        return
    status = subprocess.run(command, env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
    rehearsal = compose(args.config_path, args.config_name, overrides)
    where = Path(str(rehearsal.trainer.default_local_dir)).expanduser().resolve()
    from egpo.rehearse.schedule import report_lines

    lines, every = report_lines(rehearsal, where)
    for line in lines:
        print(line, flush=True)
    print(checkpoint_line(rehearsal, where), flush=True)
    if status:
        raise SystemExit(status)
    if not every:
        raise SystemExit("[rehearse] an event of the schedule did not hold (NOT HELD above)")


def checkpoint_line(config, where: Path) -> str:
    """The preflight's size of one checkpoint beside the newest on disk."""
    from egpo.preflight.scale import checkpoint_bytes, gb, model_shape

    saved = sorted(where.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    shape = model_shape(config)
    if not saved or shape is None:
        return "[rehearse] checkpoint: none saved, nothing to compare"
    actor = saved[-1] / "actor"
    on_disk = sum(p.stat().st_size for p in actor.rglob("*") if p.is_file() and p.suffix == ".pt")
    predicted = checkpoint_bytes(config, shape)
    ratio = on_disk / predicted if predicted else float("nan")
    return (f"[rehearse] checkpoint {saved[-1].name}: {gb(on_disk)} of shards on disk, the preflight's figure "
            f"{gb(predicted)} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
