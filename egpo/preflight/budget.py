"""What a run will generate: steps, generations and tokens per step, and validation's share of the run.

verl's dataloader drops the last partial batch; a run stops at ``trainer.total_training_steps`` or after
``trainer.total_epochs`` passes over the data, whichever comes first; it validates before training
(``val_before_train``) and at every ``test_freq``-th step and the last one, ``val_kwargs.n`` samples per prompt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from egpo.preflight.findings import Finding, error, fact, warning

VALIDATION_SHARE_WARNING = 0.25  # validation generations above this share of training generations: warned


@dataclass(frozen=True)
class Budget:
    steps: int | None
    generations_per_step: int
    tokens_per_step_max: int
    validations: int
    validation_generations: int | None

    @property
    def training_generations(self) -> int | None:
        return None if self.steps is None else self.steps * self.generations_per_step


def validations_per_run(trainer, steps: int | None, has_val: bool) -> int:
    if not has_val or steps is None:
        return 0
    before = 1 if trainer.get("val_before_train", True) else 0
    freq = int(trainer.get("test_freq", -1) or -1)
    if freq <= 0:
        return before
    return before + steps // freq + (0 if steps % freq == 0 else 1)  # every freq-th step, and the last


def _fmt(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def planned_steps(config, train_rows: int | None) -> tuple[int | None, list[Finding]]:
    """The run's steps (None: unknown) and the findings on them."""
    data, trainer = config.data, config.trainer
    batch = int(data.train_batch_size)
    findings: list[Finding] = []
    steps = None
    requested = trainer.get("total_training_steps", None)
    epochs = int(trainer.get("total_epochs", 1))
    if train_rows is not None:
        per_epoch = train_rows // batch
        if per_epoch == 0:
            fix = f"use data.train_batch_size={train_rows} or more data" if train_rows else "check the data and filters"
            findings.append(error("batch", f"data.train_files has {train_rows} rows, fewer than data.train_batch_size="
                                           f"{batch}: verl drops the partial batch, so the run has no step; {fix}"))
            steps = 0
        else:
            steps = per_epoch * epochs if requested is None else min(int(requested), per_epoch * epochs)
            if requested is not None and int(requested) > per_epoch * epochs:
                need = math.ceil(int(requested) / per_epoch)
                findings.append(warning("steps", f"trainer.total_training_steps={requested}, but {train_rows} rows / "
                                                 f"{batch} per step x {epochs} epochs ends the run after {steps} steps "
                                                 f"(and the learning-rate schedule assumes {requested}); set "
                                                 f"trainer.total_epochs={need}"))
    elif requested is not None:
        steps = int(requested)
    return steps, findings


def generation_findings(config, run) -> list[Finding]:
    """:func:`budget_findings` for the rows the data step counted (``run.rows``)."""
    return budget_findings(config, run.rows.get("data.train_files"), run.rows.get("data.val_files"))


def budget_findings(config, train_rows: int | None, val_rows: int | None) -> list[Finding]:
    data, trainer = config.data, config.trainer
    rollout = config.actor_rollout_ref.rollout
    batch = int(data.train_batch_size)
    steps, findings = planned_steps(config, train_rows)
    n = int(rollout.n)
    length = int(data.max_prompt_length) + int(data.max_response_length)
    val_kwargs = rollout.get("val_kwargs", None) or {}
    val_n = int(val_kwargs.get("n", 1))
    val_max = int(data.get("val_max_samples", -1) or -1)
    used_val_rows = None if val_rows is None else (min(val_rows, val_max) if val_max > 0 else val_rows)
    validations = validations_per_run(trainer, steps, bool(data.get("val_files", None)))
    val_generations = None if used_val_rows is None else used_val_rows * val_n * validations
    budget = Budget(steps, batch * n, batch * n * length, validations, val_generations)

    findings.append(fact("step", f"{batch} prompts x {n} samples = {budget.generations_per_step:,} generations, at most "
                                 f"{budget.tokens_per_step_max:,} tokens ({length} per sequence)"))
    train_gens = budget.training_generations
    findings.append(fact("run", f"{_fmt(steps)} steps: {_fmt(train_gens)} training generations"))
    if validations:
        share = "" if not (train_gens and val_generations is not None) else \
            f" = {val_generations / train_gens:.0%} of training"
        findings.append(fact("validate", f"{validations} validations x {_fmt(used_val_rows)} prompts x {val_n} samples = "
                                         f"{_fmt(val_generations)} generations{share}"))
        if train_gens and val_generations is not None and val_generations > VALIDATION_SHARE_WARNING * train_gens:
            rows_fix = max(1, int(VALIDATION_SHARE_WARNING * train_gens / max(1, val_n * validations)))
            findings.append(warning("validate", f"validation generates {val_generations:,} sequences, "
                                                f"{val_generations / train_gens:.0%} of training's {train_gens:,}; "
                                                f"use a validation subset (python -m egpo.data writes "
                                                f"*_val.parquet, 500 rows), ++data.val_max_samples={rows_fix}, or a "
                                                f"larger trainer.test_freq"))
        if not val_kwargs.get("do_sample", False):
            findings.append(warning("validate", "actor_rollout_ref.rollout.val_kwargs.do_sample=false validates "
                                                "greedily, and a thinking model decodes greedily into loops up to the "
                                                "length cap; set actor_rollout_ref.rollout.val_kwargs.do_sample=true "
                                                "(Qwen3 thinking: temperature=0.6 top_p=0.95 top_k=20)"))
    return findings
