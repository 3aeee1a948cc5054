"""CPU step time split of the smoke recipe, per entropy source: generation / old log prob / advantage / update.

    python bench/cpu_step.py [--steps 6] [--n 8] [--rollouts hf sglang]

Runs ``python -m egpo.main`` on recipes/cpu_smoke.yaml once per configuration and rollout engine (egpo's HF
server; sglang's real engine, which needs the sglang CPU install line) and reports the median of verl's
``timing_s/*`` over steps 2..N (step 1 includes one-off warm-up), plus each configuration's step time as a ratio
to ``entropy_source=actor`` on the HF rollout, measured in the same invocation.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from egpo.demo.build import build
from egpo.demo.smoke_run import run_smoke, step_metrics

CONFIGS = {
    "actor": ("algorithm.entropy_source=actor",),
    "rollout": ("algorithm.entropy_source=rollout",),
    "rollout+bypass": ("algorithm.entropy_source=rollout", "algorithm.rollout_correction.bypass_mode=true"),
}
PHASES = ("gen", "old_log_prob", "adv", "update_actor", "update_weights", "step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--rollouts", nargs="+", default=["hf"], choices=["hf", "sglang"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        demo = build(Path(tmp) / "demo")
        rows = {}
        for rollout, (config, overrides) in ((r, c) for r in args.rollouts for c in CONFIGS.items()):
            name = f"{rollout}: {config}"
            work = Path(tmp) / f"{rollout}_{config.replace('+', '_')}"
            work.mkdir()
            proc = run_smoke(work, demo, *overrides, f"actor_rollout_ref.rollout.name={rollout}",
                             f"trainer.total_training_steps={args.steps}",
                             f"actor_rollout_ref.rollout.n={args.n}", timeout=1200)
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
            steps = step_metrics(proc.stdout)
            later = [steps[s] for s in sorted(steps) if s > 1]
            rows[name] = {p: statistics.median(m.get(f"timing_s/{p}", 0.0) for m in later) for p in PHASES}
    base = rows[f"{args.rollouts[0]}: actor"]["step"]
    print(f"median over steps 2..{args.steps}, 4 prompts x {args.n} samples, seconds")
    print("| config | " + " | ".join(PHASES) + f" | step / {args.rollouts[0]} actor step |")
    print("|---" * (len(PHASES) + 2) + "|")
    for name, row in rows.items():
        cells = " | ".join(f"{row[p]:.3f}" for p in PHASES)
        print(f"| {name} | {cells} | {row['step'] / base:.2f}x |")


if __name__ == "__main__":
    main()
