"""``python -m egpo.generate``: samples with per-token entropy from a model or a checkpoint, no training.

    python -m egpo.generate --config-path="$PWD/recipes" --config-name=cpu_warm --out gen/base [override ...]
    python -m egpo.generate ... --checkpoint checkpoints/egpo/cpu_warm --out gen/step30
    python -m egpo.generate ... --checkpoint checkpoints/egpo/cpu_warm --score gen/base --out gen/step30_on_base
    python -m egpo.analyze gen/base gen/step30_on_base --out analysis

The recipe and overrides are ``egpo.main``'s (model, rollout engine and sampling, data); the prompts are
``data.val_files``'s (``--split train``: ``data.train_files``'s). Each prompt is sampled ``--n`` times by the rollout
engine, which returns each token's entropy and log probability as it samples (egpo's rollout entropy: hf, sglang,
vllm). ``--score DIR`` samples nothing: it teacher-forces DIR's responses through this model (the actor's recompute),
so two checkpoints are compared on the same tokens. Rows go to ``OUT/samples/*.parquet`` a chunk of prompts at a
time; ``OUT/run.json`` says what made them, ``OUT/done.json`` that all are written. The same command again finishes
an interrupted run, each row once. Columns and the analysis: docs/generate.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m egpo.generate", allow_abbrev=False,
                                     description=" ".join(__doc__.split("\n\n")[2].split()))
    parser.add_argument("--config-path", default=None, help="a recipe folder (default: egpo's own configs)")
    parser.add_argument("--config-name", default="egpo_trainer")
    parser.add_argument("--out", required=True, type=Path, help="the run's folder (created; a rerun finishes it)")
    parser.add_argument("--n", type=int, default=None, help="samples per prompt (default: actor_rollout_ref.rollout.n)")
    parser.add_argument("--max-rows", type=int, default=None, help="the data set's first rows only")
    parser.add_argument("--split", choices=("val", "train"), default="val",
                        help="prompts from data.val_files (default) or data.train_files")
    parser.add_argument("--chunk", type=int, default=None,
                        help="prompts per generate call and per part file (default: data.train_batch_size)")
    parser.add_argument("--checkpoint", default=None,
                        help="a verl run's checkpoint folder (trainer.default_local_dir: its latest step) or one "
                             "global_step_N folder; default: the model at actor_rollout_ref.model.path")
    parser.add_argument("--score", type=Path, default=None, metavar="DIR",
                        help="teacher-force DIR's responses (an egpo.generate run) instead of sampling")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m egpo.main")
    return parser


def refuse(message: str) -> SystemExit:
    return SystemExit(f"[egpo] generate refused before anything started: {message}")


def main(argv: list[str] | None = None) -> None:
    from egpo.compat.versions import environment_problems

    args = parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    problems = environment_problems()
    if problems:
        raise refuse("; ".join(problems))
    from egpo.console import quiet_driver
    from egpo.errors import EgpoError
    from egpo.generate.setup import prepare_generation

    quiet_driver()

    try:
        config, store = prepare_generation(args)
    except EgpoError as err:
        raise refuse(str(err)) from None
    if store.done():
        print(f"[egpo] generate: {store.out} is complete (done.json); nothing to do", flush=True)
        return
    from egpo.generate.setup import TRAINING_ONLY_LINES, closing_lines, launch
    from egpo.runner_console import RunnerConsole

    with RunnerConsole(closing=lambda seconds: closing_lines(store), dropped=TRAINING_ONLY_LINES):
        launch(config)
    if not store.done():
        raise SystemExit(f"[egpo] generate: {store.out} is not complete; the same command finishes it")

if __name__ == "__main__":
    main()
