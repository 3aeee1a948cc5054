"""``python -m egpo.rehearse``: a recipe's own run, whole, on this CPU, before a GPU is booked.

    python -m egpo.rehearse --config-path="$PWD/recipes" --config-name=qwen3_4b algorithm.entropy_source=rollout

It composes what ``python -m egpo.main`` would run with the same arguments, changes only what a CPU cannot hold
(:mod:`egpo.preflight.rehearsal_plan`: each change printed with the recipe's value, the rehearsal's and why), runs the real main
job with those changes in a run folder of its own (the recipe's experiment name plus ``_rehearsal``: the same
refusals, console and closing summary as the real run). At the schedule's worst moment (the validation right after
a save) it kills every process of the run at once, as a node loss does, and runs the same command again (the
resume); then the finished run's command once more (it must train nothing). It says, one line per event of the
schedule, whether the run held it (the step-0 validation, the training steps, the saves, the validations on save
steps, the last step's save) with its seconds; where the resume started and what it redid; and the preflight's
checkpoint size beside the one on disk, and its checkpoints' peak beside the one measured while the run went on
(:mod:`egpo.rehearse.measure`), and the step batch the driver held at the advantage (egpo's keys in it) beside
the preflight's figures. A run refused at start-up (or stopped before its first step) ends the
rehearsal there, with the run's own refusal above and its exit status. Exit status: the run's, else 1 where an event
did not hold.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path



def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m egpo.rehearse", allow_abbrev=False,
                                     description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--config-path", default=None, help="a recipe folder (default: egpo's own configs)")
    parser.add_argument("--config-name", default="egpo_trainer")
    parser.add_argument("--dry-run", action="store_true", help="print the changes and the command; run nothing")
    parser.add_argument("--no-kill", action="store_true",
                        help="run once, without the kill at the schedule's worst moment and its resume")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m egpo.main")
    return parser


def refuse(message: str) -> SystemExit:
    return SystemExit(f"[egpo] rehearse refused before anything started: {message}")


def main(argv: list[str] | None = None) -> None:
    from egpo.errors import EgpoError
    from egpo.preflight.compose import compose
    from egpo.preflight.rehearsal_plan import plan

    args = parser().parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    try:
        recipe = compose(args.config_path, args.config_name, list(args.overrides))
    except EgpoError as err:
        raise refuse(str(err)) from None
    changes = plan(recipe)
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
    rehearsal = compose(args.config_path, args.config_name, overrides)
    where = Path(str(rehearsal.trainer.default_local_dir)).expanduser().resolve()
    if where.exists():  # the rehearsal's own folder: a rehearsal starts from nothing
        shutil.rmtree(where)
        print(f"[rehearse] {where}: an earlier rehearsal's, removed", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    kill_step = None if args.no_kill else worst_moment(rehearsal)
    kill_lines, every_kill = [], True
    from egpo.rehearse.measure import DiskPeak, disk_line, driver_line
    from egpo.trainer.validation_after_log import HOLD_VALIDATION_AT

    with DiskPeak(where) as disk:
        if kill_step is not None:
            ended = run_until_killed(command, where, kill_step, {**env, HOLD_VALIDATION_AT: str(kill_step)})
            if ended is None:
                status = subprocess.run(command, env=env).returncode
                kill_lines, every_kill = resume_lines(where, kill_step)
            else:
                status = ended or 1
                kill_lines, every_kill = [f"[rehearse] the run ended before step {kill_step}'s line: nothing was "
                                          "killed"], False
        else:
            status = subprocess.run(command, env=env).returncode
    from egpo.runs.state import logged_steps

    if status and not logged_steps(where):
        # refused at start-up, or stopped before its first line: the run's own lines above say why and how to fix it
        raise SystemExit(f"[rehearse] the run stopped before its first step (exit status {status}; its own lines above "
                         "say why): nothing of the schedule ran")
    if status == 0:
        again = subprocess.run(command, env=env, capture_output=True, text=True)
        trained_nothing = again.returncode == 0 and "is finished" in again.stdout
        kill_lines.append(f"[rehearse] the finished run's command again: "
                          f"{'trained nothing, said it is finished' if trained_nothing else 'NOT HELD'}")
        every_kill &= trained_nothing
    from egpo.rehearse.schedule import report_lines

    lines, every = report_lines(rehearsal, where)
    for line in [*lines, *kill_lines]:
        print(line, flush=True)
    print(checkpoint_line(rehearsal, where), flush=True)
    print(disk_line(rehearsal, where, disk), flush=True)
    driver, driver_held = driver_line(rehearsal, where)
    print(driver, flush=True)
    if status:
        raise SystemExit(status)
    if not (every and every_kill and driver_held):
        raise SystemExit("[rehearse] an event of the schedule did not hold (NOT HELD above)")


def worst_moment(config) -> int | None:
    """The step whose validation, right after its save, is the worst moment to lose the run (a save that is not the
    last step's, where one coincides with a validation; else the first save before the last step; None: no save)."""
    from egpo.rehearse.schedule import expected_events

    events = expected_events(config)
    last = max((e.step for e in events), default=0)
    coinciding = [e.step for e in events if e.what == "validation on a save step" and e.step < last]
    saves = [e.step for e in events if e.what == "save" and e.step < last]
    return (coinciding or saves or [None])[0]


def run_until_killed(command: list[str], where: Path, step: int, env: dict) -> int | None:
    """The run, killed as a node loss kills it (every process at once) as soon as step ``step`` is logged: its save
    is written, its validation begun (egpo's trainer validates a save step after logging it). None once killed; else
    the exit status of a run that ended first."""
    from egpo.process_tree import kill_tree
    from egpo.runs.state import ATTEMPT_METRICS, TRAINING_STEP_KEY, read_steps

    proc = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        while proc.poll() is None:
            if any(line["step"] == step and TRAINING_STEP_KEY in line["data"] for line in read_steps(where / ATTEMPT_METRICS)):
                kill_tree(proc.pid)
                proc.wait(timeout=120)
                print(f"[rehearse] killed every process of the run during step {step}'s validation, right after its "
                      "save (as a node loss); the same command again:", flush=True)
                return None
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    return proc.returncode


def resume_lines(where: Path, step: int) -> tuple[list[str], bool]:
    """What the attempt after the kill did, read from the run's log: where it resumed, and what it redid."""
    import re

    from egpo.runs.state import LOG

    attempts = (where / LOG).read_text(errors="replace").split("\n=== ")
    resumed = re.search(r"\(resumes from step (\d+);", attempts[-1])
    step_from = int(resumed.group(1)) if resumed else 0
    revalidated = f"step {step}'s validation was cut short" in attempts[-1]
    held = step_from == step and revalidated
    return [f"[rehearse] the resume after the kill: from step {step_from} (its save kept), "
            f"{'validated step ' + str(step) + ' first, then trained on' if revalidated else 'no validation redone'}"
            f"{'' if held else '  NOT HELD'}"], held


def checkpoint_line(config, where: Path) -> str:
    """The preflight's size of one checkpoint beside the newest on disk."""
    from egpo.preflight.scale import checkpoint_bytes, gb, model_shape
    from egpo.runs.state import checkpoint_steps

    saved = checkpoint_steps(where, where)
    shape = model_shape(config)
    if not saved or shape is None:
        return "[rehearse] checkpoint: none saved, nothing to compare"
    newest = where / f"global_step_{saved[-1]}"
    actor = newest / "actor"
    on_disk = sum(p.stat().st_size for p in actor.rglob("*") if p.is_file() and p.suffix == ".pt")
    predicted = checkpoint_bytes(config, shape)
    ratio = on_disk / predicted if predicted else float("nan")
    return (f"[rehearse] checkpoint {newest.name}: {gb(on_disk)} of shards on disk, the preflight's figure "
            f"{gb(predicted)} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
