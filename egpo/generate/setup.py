"""The driver's half of ``python -m egpo.generate``: the config (the recipe's, with the generation settings), the
checkpoint and the source run checked, ``run.json`` written or matched, before Ray starts; then verl's entry point
with egpo's generation runner."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf, open_dict

from egpo.errors import EgpoConfigError
from egpo.options import rollout_custom
from egpo.preflight.findings import refuse
from egpo.generate.options import GenerateOptions, check_checkpoint_world_size, resolve_checkpoint
from egpo.runs.generation_store import SampleStore, read_run

# what a generation run sets in the training config: the rollout-entropy path of a training run (egpo's agent-loop
# manager, the engine's entropy required, log probs returned), read over every response token, no loggers
GENERATION_OVERRIDES = (
    "algorithm.adv_estimator=egpo",
    # the sampling and its entropy do not depend on the method a run trained with (an arm's GTPO or GRPO-S), and
    # EGPO's reading of the whole response below is refused beside those
    "algorithm.egpo_method=egpo",
    "algorithm.entropy_source=rollout",
    "algorithm.egpo_span=response",
    "algorithm.egpo_token_selection=all",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "trainer.logger=[console]",
    "trainer.val_before_train=false",
    # --score reads the actor's recompute: never bypassed, so egpo's fp32 entropy (and verl's compile of it off) is
    # prepared whatever an ablation arm's bypass setting (a run that only generates never recomputes)
    "algorithm.rollout_correction.bypass_mode=false",
)

# verl's lines about a training schedule a generation run does not have, left off its console: the trainer's total
# steps, the actor's learning-rate warm-up, and the resume pointer of the trainer folder (--checkpoint is loaded by
# path, and verl says "Resuming from" it)
TRAINING_ONLY_LINES = ("Total training steps:", ", num_warmup_steps:", "Checkpoint tracker file does not exist:")


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise EgpoConfigError(f"{name} must be at least 1, got {value}")


def generation_config(args):
    """The recipe plus the user's overrides plus :data:`GENERATION_OVERRIDES`, completed and
    checked by egpo.main's own pass (:func:`egpo.preflight.prepare.prepare_config`)."""
    from egpo.preflight.compose import compose
    from egpo.preflight.data import split_findings
    from egpo.preflight.prepare import prepare_config

    out = args.out.expanduser().resolve()
    overrides = [*args.overrides, *GENERATION_OVERRIDES, f"trainer.default_local_dir={out / 'trainer'}"]
    config = compose(args.config_path, args.config_name, overrides)
    checkpoint = None
    if args.checkpoint:
        checkpoint = resolve_checkpoint(args.checkpoint)
        check_checkpoint_world_size(checkpoint, config)
    with open_dict(config):
        if checkpoint:  # the weights only: no optimizer state in memory for a run that never steps
            config.actor_rollout_ref.actor.checkpoint.load_contents = ["model"]
        config.trainer.resume_mode = "resume_path" if checkpoint else "disable"
        config.trainer.resume_from_path = str(checkpoint) if checkpoint else None
        config.trainer.del_local_ckpt_after_load = False
    if OmegaConf.select(config, "actor_rollout_ref.rollout.multi_turn.enable", default=False):
        raise EgpoConfigError("egpo.generate writes single-turn responses (a multi-turn loop's tool tokens are not the "
                              "model's samples, and --score would read its turns without them): set "
                              "actor_rollout_ref.rollout.multi_turn.enable=false")
    config = prepare_config(config, preflight=None)
    # the main job's data-file check, before Ray and before --out holds anything: verl's trainer reads the files at
    # start-up
    refuse(split_findings(config)[0])
    return config, checkpoint


def recipe_options(args) -> str:
    """The recipe options of this command, as the user gave them (for a fix it prints)."""
    return " ".join([*([f"--config-path={args.config_path}"] if args.config_path else []),
                     f"--config-name={args.config_name}"])


def refuse_out_folder(given, out) -> None:
    """A generation writes into a folder of its own: never among a training run's checkpoints and metrics."""
    from egpo.folders import ABLATION, TRAINING, folder_kind

    kind = folder_kind(out)
    if kind == TRAINING:
        raise EgpoConfigError(f"--out {given} is a training run's folder (its checkpoints and metrics): give the "
                              f"generation a folder of its own, e.g. --out {Path(given) / 'generate'}")
    if kind == ABLATION:
        raise EgpoConfigError(f"--out {given} is an ablation's folder: give the generation a folder of its own, e.g. "
                              f"--out {Path(given) / 'generate_base'}")


def refuse_score_folder(args, source) -> None:
    """--score reads a finished generation run: a missing folder or a training run's is said as such."""
    from egpo.folders import MISSING, TRAINING, folder_kind, no_such_folder

    kind = folder_kind(source)
    if kind == MISSING:
        raise EgpoConfigError(no_such_folder("--score", args.score))
    if kind == TRAINING:
        raise EgpoConfigError(f"--score {args.score} is a training run's folder, not a generation run: sample from its "
                              f"checkpoint with python -m egpo.generate {recipe_options(args)} --checkpoint "
                              f"{args.score} --out {Path(args.score) / 'generate'}, then --score that folder")


def prepare_generation(args):
    """-> (config with its ``egpo_generate`` node, the store holding run.json)."""
    from egpo.runs.state import DONE, installed_versions
    from egpo.rollout.entropy import EntropyOptions

    for name in ("n", "max_rows", "chunk"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    out = args.out.expanduser().resolve()
    source = None
    refuse_out_folder(args.out, out)
    if args.score is not None:
        source = args.score.expanduser().resolve()
        refuse_score_folder(args, source)
        held = read_run(source, recipe=recipe_options(args))
        if not (source / DONE).exists():
            raise EgpoConfigError(f"--score {args.score}: that run is not finished (no done.json); rerun its command "
                                  "to finish it first")
        if source == out:
            raise EgpoConfigError("--score and --out name the same folder; give the scored rows a folder of their own")
    config, checkpoint = generation_config(args)
    rollout = config.actor_rollout_ref.rollout
    options = GenerateOptions(
        out=str(out), mode="score" if source else "generate", split=args.split,
        n=args.n or int(rollout.n), max_rows=args.max_rows, chunk=args.chunk or int(config.data.train_batch_size),
        source=str(source) if source else None, checkpoint=str(checkpoint) if checkpoint else None)
    options.into(config)
    model = str(config.actor_rollout_ref.model.path)
    temperature = float(rollout.temperature)
    if source:
        fingerprint = {"mode": "score", "model": model, "checkpoint": options.checkpoint, "source": options.source,
                       "temperature": temperature}
        entropy = {"of": "logits / temperature (the actor's recompute, teacher-forced)", "temperature": temperature,
                   "top_k": 0}
    else:
        entropy_options = EntropyOptions.from_rollout_config(rollout)
        files = config.data.val_files if args.split == "val" else config.data.train_files
        fingerprint = {"mode": "generate", "model": model, "checkpoint": options.checkpoint, "split": args.split,
                       "data_files": OmegaConf.to_container(files) if OmegaConf.is_config(files) else files,
                       "n": options.n, "max_rows": options.max_rows, "chunk": options.chunk,
                       "rollout": str(rollout.name), "temperature": temperature, "top_p": float(rollout.top_p),
                       "top_k": int(rollout.top_k), "response_length": int(rollout.response_length),
                       "seed": rollout_custom(rollout).seed}
        entropy = {"of": "logits / temperature" if entropy_options.temperature_scaled else "logits",
                   "temperature": temperature, "top_k": entropy_options.top_k}
    algorithm = config.algorithm
    details = {
        "responses_id": held.get("responses_id") if source else None,
        "entropy": entropy,
        "think_token_ids": [algorithm.get("cot_start_token_id"), algorithm.get("cot_end_token_id")],
        "tokenizer": model,
        "versions": installed_versions(),
        "config": OmegaConf.to_container(config, resolve=False),
    }
    store = SampleStore(out)
    store.start(fingerprint, details)
    print(f"[egpo] generate: {options.mode} into {out} ({'teacher-forcing ' + options.source if source else f'{options.n} samples per prompt of {args.split}'}"
          f"{', checkpoint ' + options.checkpoint if checkpoint else ''})", flush=True)
    return config, store


def closing_lines(store: SampleStore) -> list[str]:
    """What a finished generation run says last: its rows, where they are, the analysis command."""
    from egpo.runs.generation_store import read_done

    if not store.done():
        return []
    return [f"[egpo] generate: {read_done(store.out)['rows']} rows in {store.samples}; the analysis: python -m "
            f"egpo.analyze {store.out} --out {store.out / 'analysis'}"]


def launch(config) -> None:
    """egpo's one launch (:func:`egpo.runner.launch`) with the generation's task runner."""
    from egpo.generate.runner import GenerateTaskRunner
    from egpo.runner import launch as launch_runner

    launch_runner(config, GenerateTaskRunner)
