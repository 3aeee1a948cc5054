"""A run whose run directory already holds its last step's checkpoint is finished: the same command again says so
and trains nothing (verl would resume there and train a step beyond the run's)."""

from __future__ import annotations

from omegaconf import DictConfig

from egpo.preflight.budget import planned_steps
from egpo.preflight.data import inspect_split
from egpo.runs.main_dir import REPORT_LINE, resumed_step, run_directory


def finished_run(config: DictConfig) -> str | None:
    """Where the run directory's checkpoint is already at the run's last step (verl would resume there and train a
    step beyond it): what to say instead of training (None: there is a step to train). Extending a run is explicit: a
    larger ``trainer.total_training_steps`` (or ``trainer.total_epochs``)."""
    where = run_directory(config)
    if where is None or not where.is_dir():
        return None
    resume = resumed_step(config, where)
    if not resume:
        return None
    planned, _ = planned_steps(config, inspect_split(config, "data.train_files").rows)
    if planned is None or resume < planned:
        return None
    return (f"[egpo] the run in {where} is finished: its checkpoint is at step {resume} of its {planned}; nothing was "
            f"trained. To train it further: trainer.total_training_steps={planned + planned} (any number above "
            f"{planned}); to start over: trainer.resume_mode=disable, or another trainer.default_local_dir.\n"
            f"{REPORT_LINE} {where}")  # the report's line on a line of its own, as at the end of every run
