"""``python -m egpo.ablation``: the command (see the package docstring): its arguments, the checks before any run
starts, then the runs, here or on a Ray cluster."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from egpo.ablation.arms import ARM_SETS, ARMS, DEFAULT_ARMS, expand_arms, run_name
from egpo.ablation.attempt import override_value, run_command, write_run
from egpo.runs.state import CHECKPOINTS, DONE
from egpo.typos import did_you_mean


DISK_LINE = "! disk "


def default_save_every(steps: int) -> int:
    """A checkpoint every tenth of the run (20 of 200 steps), at least every step of a short one."""
    return max(1, steps // 10)


def preflight(args, demo: Path | None, dispatch: tuple[str, ...], config) -> None:
    """The preflight of every arm's config, then the checkpoints of every run not yet done against the free space of
    ``--out`` (errors stop the ablation before the first run)."""
    from egpo.preflight.compose import compose
    from egpo.preflight.__main__ import run as run_preflight
    from egpo.preflight.findings import TAGS
    from egpo.preflight.scale import ablation_disk_finding

    for arm in args.arms:
        overrides = [*ARMS[arm], f"trainer.total_training_steps={args.steps}", "trainer.logger=[console,file]",
                     f"trainer.save_freq={args.save_every or default_save_every(args.steps)}",
                     f"trainer.max_actor_ckpt_to_keep={args.keep}",
                     "trainer.default_local_dir=" + override_value(args.out / run_name(arm, args.seeds[0]) / CHECKPOINTS),
                     *([f"egpo_demo.out={demo}"] if demo else []), *dispatch, *args.overrides]
        status, lines = run_preflight(args.config_path, args.config_name, overrides)
        if status:
            raise SystemExit(f"[ablation] the preflight of arm {arm} found errors; nothing was started:\n" +
                             "\n".join(lines))
        # a run's checkpoints on disk are the ablation's to count, once for every pending run, with a resumed run's
        # keep + 1 (below): an arm's own disk line, one fresh run's, would disagree with it
        warned = [line for line in lines if line.startswith(TAGS["warning"]) and not line.startswith(DISK_LINE)]
        for line in warned:
            print(f"[ablation] arm {arm}: {line}", flush=True)
        if warned:
            print(f"[ablation] arm {arm} runs as configured all the same, each of its runs: to follow a fix above, "
                  "add it to the ablation's overrides (it then applies to every arm) or leave the arm out of --arms",
                  flush=True)
    pending = sum(not (args.out / run_name(arm, seed) / DONE).exists() for seed in args.seeds for arm in args.arms)
    if demo:
        config = compose(args.config_path, args.config_name,
                         [f"egpo_demo.out={override_value(demo)}", *args.overrides])
    disk = ablation_disk_finding(config, pending, args.keep, args.out)
    if disk is not None:
        print(f"[ablation] {disk.line()}", flush=True)
        if disk.level == "error":
            raise SystemExit("[ablation] nothing was started: the checkpoints would not fit")
    print(f"[ablation] preflight passed for {len(args.arms)} arm(s)", flush=True)


def head_memory_line(config, parallel: int) -> str:
    """What the runs at once hold on the head node: Ray starts each job's driver there, and egpo keeps each run's
    trainer (verl's task runner, which holds the step's batch) beside its driver."""
    from egpo.preflight.scale import gb, step_batch_bytes

    batch = step_batch_bytes(config)
    return (f"[ablation] the head node holds each running run's driver and trainer, and with them its step batch: "
            f"{parallel} at once x about {gb(batch)} (verl's batch at this recipe's lengths) = about "
            f"{gb(parallel * batch)} of its host memory at a step, plus each arm's 'driver' line of its preflight; "
            "a head with less: --max-parallel")


def parser() -> argparse.ArgumentParser:
    from egpo import ablation

    description = " ".join(ablation.__doc__.split("\n\n")[0].split())  # the docstring's first paragraph
    parser = argparse.ArgumentParser(prog="python -m egpo.ablation", description=description, allow_abbrev=False)
    parser.add_argument("--config-path", required=True)
    parser.add_argument("--config-name", required=True)
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), metavar="ARM",
                        help=f"arms or arm sets (default: {' '.join(DEFAULT_ARMS)}). Sets: {', '.join(ARM_SETS)}. "
                             f"Arms: {', '.join(ARMS)}")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--timeout", type=int, default=0, help="seconds per attempt of a run (default: none)")
    parser.add_argument("--stall-timeout", type=int, default=None,
                        help="an attempt that logs nothing for this long, or 5x its slowest training step if longer "
                             "(before its first training step: --start-timeout), is stopped as stalled and resumed "
                             "(0: never; default: 1800 s for responses up to 4K tokens, in proportion beyond: 7200 s "
                             "at 16K)")
    parser.add_argument("--start-timeout", type=int, default=None,
                        help="an attempt's allowance before its first training step (its start, model and engine "
                             "loads, the validation before training), at least twice the validation's time where one "
                             "was logged (default: twice --stall-timeout)")
    parser.add_argument("--save-every", type=int, default=0,
                        help="checkpoint every N steps (default: a tenth of --steps, at least 1)")
    parser.add_argument("--keep", type=int, default=2, help="checkpoints kept per run (the last ones; at least 2)")
    parser.add_argument("--retries", type=int, default=1, help="attempts after a failed one, each from its last "
                                                               "checkpoint")
    generation = parser.add_argument_group("token by token, after the runs (egpo.ablation.generation)")
    generation.add_argument("--generate", action="store_true",
                            help="after every run finished: the base model and each run's last checkpoint sample the "
                                 "validation prompts, and each checkpoint reads the base model's responses "
                                 "(python -m egpo.generate); egpo.report compares them by seed")
    generation.add_argument("--generate-n", type=int, default=None,
                            help="samples per prompt (default: the recipe's actor_rollout_ref.rollout.n)")
    generation.add_argument("--generate-rows", type=int, default=None,
                            help="the validation set's first rows only (default: all)")
    parser.add_argument("--rehearse", action="store_true",
                        help="every arm of the recipe's own configuration on this CPU, changed only where a CPU cannot "
                             "hold it (as python -m egpo.rehearse), through its first save and validation "
                             "(egpo.ablation.rehearsal)")
    cluster = parser.add_argument_group("on a Ray cluster")
    cluster.add_argument("--ray-address", default=None,
                         help="the cluster's dashboard (http://HEAD:8265): every run is a Ray job")
    cluster.add_argument("--max-parallel", type=int, default=0,
                         help="jobs at once (default: as many as the cluster's nodes hold)")
    cluster.add_argument("--runtime-env-json", default=None,
                         help="Ray runtime_env for every job, as JSON (its env_vars are added to egpo's)")
    cluster.add_argument("--job-python", default=sys.executable,
                         help="the Python each job runs, on every node (default: this one)")
    cluster.add_argument("--poll", type=float, default=5.0, help="seconds between looks at the jobs' states")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every run")
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """The arguments, checked (``--status DIR`` is read before them, by :func:`main`)."""
    args = parser().parse_args(argv)
    unknown = [name for name in args.arms if name not in ARMS and name not in ARM_SETS]
    if unknown:
        raise SystemExit("[ablation] " + "; ".join(
            f"--arms {name}: no such arm or arm set{did_you_mean(name, [*ARMS, *ARM_SETS], show=str)}"
            for name in unknown) + f". Arm sets: {', '.join(ARM_SETS)}; every arm: python -m egpo.ablation --help")
    if args.keep < 2:
        raise SystemExit("--keep must be at least 2: a run killed between saving a checkpoint and logging its step "
                         "resumes from the checkpoint before it")
    if args.ray_address is None and (args.max_parallel or args.runtime_env_json):
        raise SystemExit("--max-parallel and --runtime-env-json are for jobs on a Ray cluster: add "
                         "--ray-address http://HEAD:8265")
    if args.rehearse and args.ray_address:
        raise SystemExit("--rehearse runs every arm on this machine's CPU: leave out --ray-address (and rerun without "
                         "--rehearse, with --ray-address, for the ablation itself)")
    if args.generate and args.ray_address:
        raise SystemExit("--generate runs on this machine after the runs: rerun the same command without --ray-address "
                         "and with --generate on a machine with the recipe's GPUs (finished runs are not rerun)")
    args.arms = expand_arms(args.arms)
    return args


def stop_as_on_ctrl_c(signum, frame):
    """SIGTERM (a scheduler cancelling the ablation, ``kill PID``) ends it as Ctrl-C does: the runs it started, and
    on a cluster the jobs it submitted, are stopped before it exits, not left running."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--status"]:
        from egpo.ablation.status import status_lines

        if len(argv) != 2:
            raise SystemExit("usage: python -m egpo.ablation --status DIR")
        print("\n".join(status_lines(Path(argv[1]))))
        return
    args = parse(argv)
    signal.signal(signal.SIGTERM, stop_as_on_ctrl_c)
    if args.rehearse:  # its cluster's token, before anything of Ray's is imported (Ray reads it once)
        from egpo.ablation.rehearsal_cluster import RehearsalCluster
        from egpo.preflight.rehearsal_plan import RANKS

        own = RehearsalCluster(RANKS)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    from egpo.errors import EgpoError
    from egpo.preflight.compose import compose

    try:
        config = compose(args.config_path, args.config_name, list(args.overrides))
    except EgpoError as err:
        raise SystemExit(f"[ablation] nothing was started: {err}") from None
    if not args.rehearse:
        run_ablation(args, config)
        return
    from egpo.ablation.rehearsal import rehearse, rehearsal_end
    from egpo.ablation.rehearsal_cluster import Faults

    rehearse(args, config, default_save_every)
    config = compose(args.config_path, args.config_name, list(args.overrides))  # the rehearsal's, for its figures
    with own:
        args.ray_address = own.dashboard
        faults = Faults(own)
        try:
            run_ablation(args, config, before_dispatch=faults.start)
        finally:
            faults.stop()
            held = rehearsal_end(args, faults)
    if not held:
        raise SystemExit("[ablation] the rehearsal met a fault the ablation did not hold (NOT HELD above)")


def run_ablation(args, config, before_dispatch=None) -> None:
    """The ablation of the parsed command ``args`` (``config``: its composed recipe): here, or as Ray jobs where
    ``args.ray_address`` names a cluster (``before_dispatch()``: called once the jobs are about to be submitted)."""
    client = dispatch = None
    if args.ray_address:
        from egpo.ablation.cluster import CLUSTER_OVERRIDES, connect

        client, dispatch = connect(args.ray_address), CLUSTER_OVERRIDES
    demo = None
    from egpo.options import OptionError, at

    try:
        options = at(config, "egpo_demo")
    except OptionError as err:
        raise SystemExit(f"[ablation] nothing was started: {err}") from None
    if options is not None:
        from egpo.demo.build import build

        demo = build(args.out / "demo", seed=options.seed, warm=options.warm).resolve()
    preflight(args, demo, dispatch or (), config)
    if args.stall_timeout is None:
        from egpo.ablation.attempt import default_stall_timeout

        args.stall_timeout = default_stall_timeout(config)
    python = args.job_python if client else sys.executable
    runs = []
    for seed in args.seeds:
        for arm in args.arms:
            work = args.out / run_name(arm, seed)
            if not (work / DONE).exists():
                command = run_command(work, args.config_path, args.config_name, arm, seed, args.steps,
                                      [*(dispatch or ()), *args.overrides], demo,
                                      args.save_every or default_save_every(args.steps), args.keep, python)
                write_run(work, arm, seed, args.steps, command, args.keep, args.timeout, args.stall_timeout,
                          recipe=args.config_name, overrides=list(args.overrides), start_timeout=args.start_timeout)
            runs.append(work)
    if client is None:
        from egpo.ablation.local import run_locally

        failed = run_locally(runs, args.retries)
    else:
        from egpo.ablation.cluster import JobDispatch, default_max_parallel, live_capacity, runtime_env

        held = default_max_parallel(args.ray_address, config)
        parallel = min(args.max_parallel or held, held)
        if args.max_parallel > held:
            print(f"[ablation] --max-parallel {args.max_parallel}, but the cluster's nodes hold {held} run(s) at once: "
                  f"at most {held} (more would wait in verl's placement or fail its GPU check)", flush=True)
        print(f"[ablation] {len(runs)} run(s) as Ray jobs on {args.ray_address}, at most {parallel} at once",
              flush=True)
        print(head_memory_line(config, parallel), flush=True)
        if before_dispatch is not None:
            before_dispatch()
        failed = JobDispatch(client, args.ray_address, parallel, args.retries, runtime_env(args.runtime_env_json),
                             args.job_python, args.poll, live_capacity(args.ray_address, config)).run(runs)
    if failed:
        raise SystemExit(f"[ablation] {len(failed)} run(s) failed: {', '.join(failed)}; rerun the same command to "
                         "resume them from their last checkpoints")
    if args.generate:
        from egpo.ablation.generation import generation_commands, run_generation

        commands = generation_commands(args.out, runs, args.config_path, args.config_name, list(args.overrides), demo,
                                       args.generate_n, args.generate_rows)
        failed = run_generation(commands)
        if failed:
            raise SystemExit(f"[ablation] {len(failed)} generation run(s) failed; rerun the same command to finish "
                             "them")
    print(f"[ablation] all {len(runs)} runs done; report: python -m egpo.report {args.out}")
