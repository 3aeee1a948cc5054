"""Runs EGPO's ablation arms x seeds through the real trainer, resumably: on this machine one after the other, or
on an existing Ray cluster as one job per run.

    python -m egpo.ablation --config-path="$PWD/recipes" --config-name=cpu_warm \\
        [--arms grpo egpo_actor egpo_rollout egpo_rollout_bypass egpo_surprisal] [--seeds 0 1 2 3 4] \\
        [--steps 30] [--ray-address http://HEAD:8265 [--max-parallel N]] --out DIR [override ...]
    python -m egpo.ablation --status DIR

Each run is ``python -m egpo.main`` with the arm's and the seed's overrides, then yours; verl's file logger writes
its metrics to ``DIR/<arm>__seed<k>/metrics.jsonl`` (one ``{"step": n, "data": {...}}`` line per step), its console
to ``log.txt`` beside it, and ``run.json`` records the command. A run that finished (``done.json``) is skipped, so
the same command resumes an interrupted ablation. Every run saves verl checkpoints every ``--save-every`` steps
(default: a tenth of the run) and keeps the last ``--keep``; a run that died resumes from its last checkpoint (verl's
``trainer.resume_mode=auto``) with its metrics continued, each step once (:mod:`egpo.runs.state`). A failed attempt is
retried up to ``--retries`` times, its log's tail printed. A recipe that builds a demo (``egpo_demo``) builds it
once, in ``DIR/demo``, for every run. ``python -m egpo.report DIR`` turns the directory into a report.

With ``--ray-address`` (the cluster's dashboard, ``http://HEAD:8265``) every pending run is a Ray job
(:mod:`egpo.ablation.cluster`), at most ``--max-parallel`` at once (default: as many as the cluster's nodes hold,
from the recipe's ``trainer.nnodes`` and ``trainer.n_gpus_per_node``); ``DIR`` and the directory the command is
given in must be on storage every node mounts at the same path. Ctrl-C stops the jobs the ablation submitted, and
only those.

Every run starts in the directory the command was given in, so relative paths (``--out``, the recipes'
``data/math_train.parquet``) mean the same in every run as on the command line; Hydra's own output goes into
the run's directory. Before the first run the preflight (:mod:`egpo.preflight`) checks the composed config, so a
missing data file or an unusable logger stops the ablation before any run starts.

Layout: :mod:`~egpo.ablation.arms` (what each arm overrides), :mod:`~egpo.ablation.attempt` (one attempt of one
run, also a Ray job's entrypoint), :mod:`~egpo.ablation.local` and :mod:`~egpo.ablation.cluster` (where the runs
run), :mod:`~egpo.ablation.status` (``--status``), :mod:`~egpo.ablation.rehearsal` (``--rehearse``: every arm of the
recipe's own configuration on this CPU first), :mod:`~egpo.ablation.cli` (the command).

Arms (egpo_lambda and the rest come from the config and your overrides):

    grpo                 EGPO with egpo_lambda=0: bit-identical to verl's GRPO advantage, and logs the same
                         CoT-entropy metrics as the other arms
    egpo_actor           EGPO, entropy from the actor's recompute
    egpo_rollout         EGPO, entropy returned by the rollout engine while sampling
    egpo_rollout_bypass  EGPO, rollout entropy, bypass mode (no old-log-prob recompute)
    egpo_surprisal       EGPO, the sampled tokens' surprisal (-log p, from the rollout's log probs) for the entropy
    egpo_token_{actor,rollout,surprisal}          egpo_granularity=token: a bonus per token (Cheng et al.)
    egpo_respspan_{actor,rollout,surprisal}       egpo_span=response: the entropy of every response token
    egpo_token_respspan_{actor,rollout,surprisal} both
    <arm>_vllm           any arm above with vLLM as the rollout engine (actor_rollout_ref.rollout.name=vllm)

Arm sets: ``--arms sources`` (the default: grpo egpo_actor egpo_rollout egpo_rollout_bypass egpo_surprisal)
compares where the entropy comes from, and what the exact entropy buys over the surprisal; ``--arms estimators``
(grpo egpo_rollout egpo_token_rollout egpo_respspan_rollout) compares the estimator family on the rollout's entropy;
``--arms vllm_sources`` is ``sources`` rolled out by vLLM; ``--arms engines`` (egpo_rollout egpo_rollout_vllm)
compares EGPO on sglang's and vLLM's rollout entropy (report it with ``--baseline egpo_rollout``).

A seed sets the rollout's sampling seed and the data order: egpo's HF server (``rollout.custom.seed``), and on verl
0.9.1 verl's rollout seed (``rollout.seed``), from which each replica's engine seed is derived (vLLM: verl's
``replica_rank + seed``; sglang: egpo's server, the same). verl 0.7.1 has no rollout seed: there its vLLM replicas are
seeded by their rank alone and its sglang servers by ``replica_rank + rollout.custom.seed``.
"""

from egpo.ablation.arms import ARM_SETS, ARMS, DEFAULT_ARMS, expand_arms, run_name, seed_overrides
from egpo.ablation.cli import main
from egpo.ablation.status import status_lines

__all__ = ["ARMS", "ARM_SETS", "DEFAULT_ARMS", "expand_arms", "main", "run_name", "seed_overrides", "status_lines"]
