"""Runs EGPO's ablation arms x seeds through the real trainer, one after the other, resumably.

    python -m egpo.ablation --config-path="$PWD/recipes" --config-name=cpu_warm \\
        [--arms grpo egpo_actor egpo_rollout egpo_rollout_bypass] [--seeds 0 1 2 3 4] [--steps 30] \\
        --out DIR [override ...]

Each run is ``python -m egpo.main`` with the arm's and the seed's overrides, then yours; verl's file logger writes
its metrics to ``DIR/<arm>__seed<k>/metrics.jsonl`` (one ``{"step": n, "data": {...}}`` line per step), its console
to ``log.txt`` beside it, and ``run.json`` records the command. A run that finished (``done.json``) is skipped, so
the same command resumes an interrupted ablation. Every run saves verl checkpoints every ``--save-every`` steps
(default: a tenth of the run) and keeps the last ``--keep``; a run that died resumes from its last checkpoint (verl's
``trainer.resume_mode=auto``) with its metrics continued, each step once (:mod:`egpo.run_state`). A failed attempt is
retried up to ``--retries`` times, its log's tail printed. ``python -m egpo.ablation --status DIR`` prints the arms x
seeds grid. A recipe that builds a demo (``egpo_demo``) builds it once, in
``DIR/demo``, for every run. ``python -m egpo.report DIR`` turns the directory into a report.

Every run starts in the directory the command was given in, so relative paths (``--out``, the recipes'
``data/math_train.parquet``) mean the same in every run as on the command line; Hydra's own output goes into
the run's directory. Before the first run the preflight (:mod:`egpo.preflight`) checks the composed config, so a
missing data file or an unusable logger stops the ablation before any run starts.

Arms (egpo_lambda and the rest come from the config and your overrides):

    grpo                 EGPO with egpo_lambda=0: bit-identical to verl's GRPO advantage, and logs the same
                         CoT-entropy metrics as the other arms
    egpo_actor           EGPO, entropy from the actor's recompute
    egpo_rollout         EGPO, entropy returned by the rollout engine while sampling
    egpo_rollout_bypass  EGPO, rollout entropy, bypass mode (no old-log-prob recompute)
    egpo_token_{actor,rollout}          egpo_granularity=token: a bonus per token (Cheng et al.)
    egpo_respspan_{actor,rollout}       egpo_span=response: the entropy of every response token
    egpo_token_respspan_{actor,rollout} both
    <arm>_vllm           any arm above with vLLM as the rollout engine (actor_rollout_ref.rollout.name=vllm)

Arm sets: ``--arms sources`` (the default: grpo egpo_actor egpo_rollout egpo_rollout_bypass) compares where the
entropy comes from; ``--arms estimators`` (grpo egpo_rollout egpo_token_rollout egpo_respspan_rollout) compares
the estimator family on the rollout's entropy; ``--arms vllm_sources`` is ``sources`` rolled out by vLLM;
``--arms engines`` (egpo_rollout egpo_rollout_vllm) compares EGPO on sglang's and vLLM's rollout entropy (report it
with ``--baseline egpo_rollout``).

A seed sets the rollout's sampling seed and the data order: egpo's HF server (``rollout.custom.seed``), and on verl
0.9.1 verl's rollout seed (``rollout.seed``), from which each replica's engine seed is derived (vLLM: verl's
``replica_rank + seed``; sglang: egpo's server, the same). verl 0.7.1 has no rollout seed: there its vLLM replicas are
seeded by their rank alone and its sglang servers by ``replica_rank + rollout.custom.seed``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from egpo.run_state import CHECKPOINTS, DONE, RUN, begin_attempt, end_attempt, record_attempt

ESTIMATOR = "algorithm.adv_estimator=egpo"
SOURCE = {"actor": "algorithm.entropy_source=actor", "rollout": "algorithm.entropy_source=rollout"}
VARIANTS = {  # name part -> overrides: EGPO's granularity and span (algorithm.egpo_granularity / egpo_span)
    "": (),
    "token_": ("algorithm.egpo_granularity=token",),
    "respspan_": ("algorithm.egpo_span=response",),
    "token_respspan_": ("algorithm.egpo_granularity=token", "algorithm.egpo_span=response"),
}
ENGINES = {  # name suffix -> overrides: the rollout engine (none: the config's own)
    "": (),
    "_vllm": ("actor_rollout_ref.rollout.name=vllm",),
}
_ESTIMATOR_ARMS = {
    "grpo": (ESTIMATOR, "algorithm.egpo_lambda=0", SOURCE["actor"]),
    **{f"egpo_{variant}{source}": (ESTIMATOR, *overrides, SOURCE[source])
       for variant, overrides in VARIANTS.items() for source in SOURCE},
    "egpo_rollout_bypass": (ESTIMATOR, SOURCE["rollout"], "algorithm.rollout_correction.bypass_mode=true"),
}
ARMS = {f"{arm}{suffix}": (*overrides, *engine)
        for suffix, engine in ENGINES.items() for arm, overrides in _ESTIMATOR_ARMS.items()}
ARM_SETS = {  # names --arms also takes
    "sources": ("grpo", "egpo_actor", "egpo_rollout", "egpo_rollout_bypass"),
    "estimators": ("grpo", "egpo_rollout", "egpo_token_rollout", "egpo_respspan_rollout"),
    "vllm_sources": ("grpo_vllm", "egpo_actor_vllm", "egpo_rollout_vllm", "egpo_rollout_bypass_vllm"),
    "engines": ("egpo_rollout", "egpo_rollout_vllm"),
}
DEFAULT_ARMS = ARM_SETS["sources"]


def expand_arms(names: list[str]) -> list[str]:
    """Arm names, with set names replaced by their arms (first occurrence kept)."""
    arms = [arm for name in names for arm in ARM_SETS.get(name, (name,))]
    return list(dict.fromkeys(arms))


def seed_overrides(seed: int) -> tuple[str, ...]:
    """The run's rollout seed, from which each replica's engine seed is derived as verl derives it
    (:mod:`egpo.compat.seeds`), and the data order."""
    from egpo.compat.seeds import run_seed_overrides

    return (*run_seed_overrides(seed), f"++data.seed={seed}")


def run_name(arm: str, seed: int) -> str:
    return f"{arm}__seed{seed}"


def default_save_every(steps: int) -> int:
    """A checkpoint every tenth of the run (20 of 200 steps), at least every step of a short one."""
    return max(1, steps // 10)


def run_command(work: Path, config_path: str, config_name: str, arm: str, seed: int, steps: int,
                overrides: list[str], demo: Path | None, save_every: int, keep: int) -> list[str]:
    args = [*ARMS[arm], *seed_overrides(seed), f"trainer.total_training_steps={steps}", "trainer.logger=[console,file]",
            f"trainer.experiment_name={run_name(arm, seed)}", f"trainer.default_local_dir={work / CHECKPOINTS}",
            f"trainer.save_freq={save_every}", "trainer.resume_mode=auto", f"trainer.max_actor_ckpt_to_keep={keep}",
            f"trainer.max_critic_ckpt_to_keep={keep}", f"hydra.run.dir={work / 'hydra'}",
            *([f"egpo_demo.out={demo}"] if demo else []), *overrides]
    return [sys.executable, "-m", "egpo.main", f"--config-path={Path(config_path).resolve()}",
            f"--config-name={config_name}", *args]


def log_tail(work: Path, lines: int = 20) -> str:
    log = work / "log.txt"
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"


def run_one(out: Path, config_path: str, config_name: str, arm: str, seed: int, steps: int,
            overrides: list[str], demo: Path | None, timeout: int, save_every: int = 0, keep: int = 2) -> dict:
    """One attempt of one run: from its last checkpoint, if any. The run's process gets a session of its own, so
    stopping it stops all it started (Ray's processes among them)."""
    work = out / run_name(arm, seed)
    work.mkdir(parents=True, exist_ok=True)
    cmd = run_command(work, config_path, config_name, arm, seed, steps, overrides, demo,
                      save_every or default_save_every(steps), keep)
    (work / RUN).write_text(json.dumps({"arm": arm, "seed": seed, "steps": steps, "command": cmd}, indent=1))
    resume, attempt_metrics = begin_attempt(work)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VERL_FILE_LOGGER_PATH": str(attempt_metrics)}
    start = time.time()
    with open(work / "log.txt", "a") as log:
        log.write(f"[ablation] attempt from step {resume}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        record_attempt(work, proc.pid, resume)
        try:
            returncode = proc.wait(timeout=timeout)
        except BaseException:  # a timeout, Ctrl-C: the run and everything it started stop with the ablation
            stop_process_group(proc)
            end_attempt(work, {"returncode": -9, "seconds": round(time.time() - start, 1), "resumed_from": resume},
                        keep)
            raise
    result = {"returncode": returncode, "seconds": round(time.time() - start, 1), "resumed_from": resume}
    end_attempt(work, result, keep)
    return result


def stop_process_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def preflight(args, demo: Path | None) -> None:
    """The preflight of every arm's config (its errors stop the ablation before the first run)."""
    from egpo.preflight.__main__ import run as run_preflight

    for arm in args.arms:
        overrides = [*ARMS[arm], f"trainer.total_training_steps={args.steps}", "trainer.logger=[console,file]",
                     *([f"egpo_demo.out={demo}"] if demo else []), *args.overrides]
        status, lines = run_preflight(args.config_path, args.config_name, overrides)
        if status:
            raise SystemExit(f"[ablation] the preflight of arm {arm} found errors; nothing was started:\n" +
                             "\n".join(lines))
    print(f"[ablation] preflight passed for {len(args.arms)} arm(s)", flush=True)


REWARD = ("critic/score/mean",)
COT_ENTROPY = ("egpo/cot_entropy_mean",)


def _hours(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min"


def _value(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def status_lines(root: Path) -> list[str]:
    """The arms x seeds grid of an ablation directory, then one row per run."""
    from egpo.run_state import run_status

    runs = {}
    for meta in sorted(root.glob(f"*/{RUN}")):
        info = json.loads(meta.read_text())
        runs[(info["arm"], int(info["seed"]))] = run_status(meta.parent)
    if not runs:
        raise SystemExit(f"no ablation runs under {root} (no */{RUN})")
    arms = list(dict.fromkeys(arm for arm, _ in runs))
    seeds = sorted({seed for _, seed in runs})

    def cell(status) -> str:
        if status.state == "done":
            return "done"
        where = f"step {status.step}/{status.steps}" if status.steps else f"step {status.step}"
        return {"running": f"running at {where}", "failed": f"FAILED at {where}"}.get(status.state, "pending")

    lines = ["| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for arm in arms:
        lines.append(f"| {arm} | " + " | ".join(cell(runs[(arm, s)]) if (arm, s) in runs else "not started"
                                                for s in seeds) + " |")
    lines += ["", "| run | state | step | wall time | reward | CoT entropy |", "|---|---|---|---|---|---|"]
    for (arm, seed), status in runs.items():
        lines.append(f"| {run_name(arm, seed)} | {status.state} | {status.step}/{status.steps or '?'} | "
                     f"{_hours(status.seconds)} | {_value(status.metric(*REWARD))} | "
                     f"{_value(status.metric(*COT_ENTROPY))} |")
    counts = {state: sum(s.state == state for s in runs.values()) for state in ("done", "running", "failed", "pending")}
    lines += ["", ", ".join(f"{n} {state}" for state, n in counts.items() if n) + f" of {len(runs)} run(s)"]
    return lines


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--status"]:
        if len(argv) != 2:
            raise SystemExit("usage: python -m egpo.ablation --status DIR")
        print("\n".join(status_lines(Path(argv[1]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-path", required=True)
    parser.add_argument("--config-name", required=True)
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=[*ARMS, *ARM_SETS],
                        help=f"arms or arm sets ({', '.join(ARM_SETS)})")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--timeout", type=int, default=7200, help="seconds per attempt of a run")
    parser.add_argument("--save-every", type=int, default=0,
                        help="checkpoint every N steps (default: a tenth of --steps, at least 1)")
    parser.add_argument("--keep", type=int, default=2, help="checkpoints kept per run (the last ones; at least 2)")
    parser.add_argument("--retries", type=int, default=1, help="attempts after a failed one, each from its last "
                                                               "checkpoint")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every run")
    args = parser.parse_args(argv)
    if args.keep < 2:
        raise SystemExit("--keep must be at least 2: a run killed between saving a checkpoint and logging its step "
                         "resumes from the checkpoint before it")
    args.arms = expand_arms(args.arms)

    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    from egpo.preflight.__main__ import compose

    config = compose(args.config_path, args.config_name, list(args.overrides))  # validates the overrides first
    demo = None
    if config.get("egpo_demo", None) is not None:
        from egpo.demo.build import build

        demo = build(args.out / "demo", seed=int(config.egpo_demo.get("seed", 0)),
                     warm=bool(config.egpo_demo.get("warm", False))).resolve()
    preflight(args, demo)
    runs = [(arm, seed) for seed in args.seeds for arm in args.arms]
    failed = []
    for i, (arm, seed) in enumerate(runs, 1):
        name = run_name(arm, seed)
        if (args.out / name / DONE).exists():
            print(f"[ablation] {i}/{len(runs)} {name}: done before, skipped", flush=True)
            continue
        for attempt in range(args.retries + 1):
            print(f"[ablation] {i}/{len(runs)} {name}: running {args.steps} steps ...", flush=True)
            result = run_one(args.out, args.config_path, args.config_name, arm, seed, args.steps,
                             list(args.overrides), demo, args.timeout, args.save_every, args.keep)
            if result["returncode"] == 0:
                print(f"[ablation] {i}/{len(runs)} {name}: done in {result['seconds']} s (from step "
                      f"{result['resumed_from']})", flush=True)
                break
            again = attempt < args.retries
            print(f"[ablation] {i}/{len(runs)} {name}: FAILED (rc {result['returncode']}) in {result['seconds']} s"
                  f"{', retrying from its last checkpoint' if again else ''}; the end of {name}/log.txt:\n"
                  + log_tail(args.out / name), flush=True)
        else:
            failed.append(name)
    if failed:
        raise SystemExit(f"[ablation] {len(failed)} run(s) failed: {', '.join(failed)}; rerun the same command to "
                         "resume them from their last checkpoints")
    print(f"[ablation] all {len(runs)} runs done; report: python -m egpo.report {args.out}")

if __name__ == "__main__":
    main()
