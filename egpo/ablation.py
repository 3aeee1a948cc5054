"""Runs EGPO's ablation arms x seeds through the real trainer, one after the other, resumably.

    python -m egpo.ablation --config-path="$PWD/recipes" --config-name=cpu_warm \\
        [--arms grpo egpo_actor egpo_rollout egpo_rollout_bypass] [--seeds 0 1 2 3 4] [--steps 30] \\
        --out DIR [override ...]

Each run is ``python -m egpo.main`` with the arm's and the seed's overrides, then yours; verl's file logger writes
its metrics to ``DIR/<arm>__seed<k>/metrics.jsonl`` (one ``{"step": n, "data": {...}}`` line per step), its console
to ``log.txt`` beside it, and ``run.json`` records the command. A run that finished (``done.json``) is skipped, so
the same command resumes an interrupted ablation. A recipe that builds a demo (``egpo_demo``) builds it once, in
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
import subprocess
import sys
import time
from pathlib import Path

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


METRICS_FILE = "metrics.jsonl"


def seed_overrides(seed: int) -> tuple[str, ...]:
    """The run's rollout seed, from which each replica's engine seed is derived as verl derives it
    (:mod:`egpo.compat.seeds`), and the data order."""
    from egpo.compat.seeds import run_seed_overrides

    return (*run_seed_overrides(seed), f"++data.seed={seed}")


def run_name(arm: str, seed: int) -> str:
    return f"{arm}__seed{seed}"


def run_one(out: Path, config_path: str, config_name: str, arm: str, seed: int, steps: int,
            overrides: list[str], demo: Path | None, timeout: int) -> dict:
    work = out / run_name(arm, seed)
    work.mkdir(parents=True, exist_ok=True)
    args = [*ARMS[arm], *seed_overrides(seed), f"trainer.total_training_steps={steps}", "trainer.logger=[console,file]",
            f"trainer.experiment_name={run_name(arm, seed)}", f"trainer.default_local_dir={work / 'checkpoints'}",
            "trainer.save_freq=-1", f"hydra.run.dir={work / 'hydra'}", *([f"egpo_demo.out={demo}"] if demo else []),
            *overrides]
    cmd = [sys.executable, "-m", "egpo.main", f"--config-path={Path(config_path).resolve()}",
           f"--config-name={config_name}", *args]
    (work / "run.json").write_text(json.dumps({"arm": arm, "seed": seed, "steps": steps, "command": cmd}, indent=1))
    metrics = work / METRICS_FILE
    metrics.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "VERL_FILE_LOGGER_PATH": str(metrics)}
    start = time.time()
    with open(work / "log.txt", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=timeout)
    result = {"returncode": proc.returncode, "seconds": round(time.time() - start, 1)}
    if proc.returncode == 0:
        (work / "done.json").write_text(json.dumps(result) + "\n")
    return result


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-path", required=True)
    parser.add_argument("--config-name", required=True)
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=[*ARMS, *ARM_SETS],
                        help=f"arms or arm sets ({', '.join(ARM_SETS)})")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--timeout", type=int, default=7200, help="seconds per run")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every run")
    args = parser.parse_args(argv)
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
        if (args.out / name / "done.json").exists():
            print(f"[ablation] {i}/{len(runs)} {name}: done before, skipped", flush=True)
            continue
        print(f"[ablation] {i}/{len(runs)} {name}: running {args.steps} steps ...", flush=True)
        result = run_one(args.out, args.config_path, args.config_name, arm, seed, args.steps, list(args.overrides),
                         demo, args.timeout)
        status = "done" if result["returncode"] == 0 else f"FAILED (rc {result['returncode']}, see {name}/log.txt)"
        print(f"[ablation] {i}/{len(runs)} {name}: {status} in {result['seconds']} s", flush=True)
        if result["returncode"] != 0:
            failed.append(name)
    if failed:
        raise SystemExit(f"[ablation] {len(failed)} run(s) failed: {', '.join(failed)}; rerun the same command to retry them")
    print(f"[ablation] all {len(runs)} runs done; report: python -m egpo.report {args.out}")


if __name__ == "__main__":
    main()
