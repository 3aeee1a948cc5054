"""``python -m egpo.ablation --rehearse``: the ablation of a recipe rehearsed on this CPU before its GPU hours. Every
arm runs with the recipe's own configuration, changed only where a CPU cannot hold it (:mod:`egpo.preflight.rehearsal_plan`:
the same changes, each printed, as ``python -m egpo.rehearse``), through the ablation's own machinery (its preflight
of every arm, its runs, checkpoints, stall watch, resume, ``--status`` and report). The ablation's schedule
(``--steps``, ``--save-every``, the recipe's ``test_freq``) is divided by its greatest common divisor and each run
ends once it has saved and validated (its last step does both); the stall watch's allowance scales with the token
counts, its allowance for a run's start has a floor of a CPU's. The runs are Ray jobs on a cluster of the rehearsal's own (:mod:`egpo.ablation.rehearsal_cluster`: a head
and two nodes on this machine, token-authenticated), where one node is lost mid-step and one step hangs."""

from __future__ import annotations

import math
from functools import reduce

STALL_FLOOR_S = 120  # the stall allowance a rehearsal's run gets at the least (a CPU step)
# an attempt's allowance before its first training step, at the least: its start on this CPU (a job's driver, two
# ranks, the rollout, each importing torch and verl, then the model's load and the validation before training) does
# not scale with the tokens, and on two cores shared with other work it has taken over 6 minutes
START_FLOOR_S = 900
RETRIES = 3  # attempts after a failed one, at least: one run may meet both faults, and one spare


def rehearsal_schedule(steps: int, save_every: int, test_freq: int) -> tuple[int, int, int]:
    """(steps, save_every, test_freq) divided by their greatest common divisor, the steps cut to the first step by
    which the run has saved and validated (a frequency <= 0: off, kept)."""
    divisor = reduce(math.gcd, [n for n in (steps, save_every, test_freq) if n > 0], 0) or 1
    steps, save, test = steps // divisor, save_every // divisor, (test_freq // divisor if test_freq > 0 else test_freq)
    through = max([save, *([test] if test > 0 else [])])
    return min(steps, through), save, test


def rehearse(args, config, default_save_every) -> None:
    """Turn ``args`` (the parsed command, ``config`` its composed recipe) into the rehearsal's: the plan's overrides
    after the user's, the schedule divided and cut, the stall allowance scaled. Each change is printed."""
    from egpo.ablation.attempt import default_stall_timeout
    from egpo.ablation.rehearsal_cluster import NODES
    from egpo.preflight.rehearsal_plan import RANKS, SCHEDULE_KEYS, plan, token_factor

    # the ablation's schedule, below; ray.init's counts are the cluster's nodes' (its runs join it)
    changes = [c for c in plan(config) if c.key not in SCHEDULE_KEYS and not c.key.startswith("ray_kwargs.ray_init.")]
    save_every = args.save_every or default_save_every(args.steps)
    test_freq = int(config.trainer.get("test_freq", -1) or -1)
    steps, save, test = rehearsal_schedule(args.steps, save_every, test_freq)
    prompt = int(config.data.max_prompt_length)
    factor = token_factor(config)
    stall = args.stall_timeout if args.stall_timeout is not None else \
        max(STALL_FLOOR_S, int(default_stall_timeout(config) * factor))
    start = args.start_timeout if args.start_timeout is not None else max(START_FLOOR_S, 2 * stall)
    print(f"[ablation] rehearsal of {args.config_name} on this CPU: {len(changes)} change(s) to every arm, "
          "everything else the recipe's", flush=True)
    for change in changes:
        print(f"[ablation] {change.line().strip()}", flush=True)
    print(f"[ablation] schedule: --steps {args.steps} -> {steps}, --save-every {save_every} -> {save}, "
          f"trainer.test_freq {test_freq} -> {test} (over their greatest common divisor, through the first save and "
          f"validation); the stall allowance {stall} s (the recipe's x {factor:.4g}, as the prompt's {prompt} tokens, "
          f"at least {STALL_FLOOR_S} s), before a run's first training step {start} s (its start on this CPU, at least "
          f"{START_FLOOR_S} s)", flush=True)
    retries = max(args.retries, RETRIES)
    print(f"[ablation] on a Ray cluster of the rehearsal's own (a head and {NODES} nodes of {RANKS} rank(s) on this "
          f"machine, token-authenticated), a node lost mid-step and a step hung; --retries {args.retries} -> "
          f"{retries} (one run may meet both, and one spare for this machine's own)", flush=True)
    args.overrides = [*args.overrides, *(c.override() for c in changes), f"trainer.test_freq={test}"]
    args.steps, args.save_every, args.stall_timeout, args.retries = steps, save, stall, retries
    args.start_timeout = start


def rehearsal_end(args, faults) -> bool:
    """What each fault did, then ``--status`` and the report of the rehearsal's folder; whether every fault held."""
    import subprocess
    import sys

    from egpo.ablation.status import status_lines

    lines, held = faults.lines()
    for line in lines:
        print(line, flush=True)
    print("[ablation] python -m egpo.ablation --status " + str(args.out), flush=True)
    print("\n".join(status_lines(args.out)), flush=True)
    report = subprocess.run([sys.executable, "-m", "egpo.report", str(args.out), "--window", "1"],
                            capture_output=True, text=True)
    said = (report.stdout + report.stderr).strip().splitlines()
    print(f"[ablation] python -m egpo.report {args.out} --window 1: "
          + (said[-1] if report.returncode == 0 and said else f"FAILED (exit {report.returncode}): " +
             "\n".join(said[-20:])), flush=True)
    return held and report.returncode == 0
