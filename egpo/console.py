"""A main job's console: what verl prints at length is kept in the run directory and said in one line.

In verl's task-runner process (egpo's runner, before verl's ``run``), for a run with a run directory
(:mod:`egpo.runs.main_dir`):

* verl's dump of the whole configuration (``pprint`` in ``TaskRunner.run``, about 900 lines) becomes one line naming
  the run's ``config.yaml``;
* verl's dump of the validation metrics before training (``pprint`` in ``RayPPOTrainer.fit``, about 50 lines)
  becomes one line naming ``metrics.jsonl``; the dump after training is left to the driver's closing summary (pass@k,
  and where every figure is), which ends the console;
* the warnings every run of an egpo estimator gets from verl and says nothing by (:data:`EXPECTED_WARNINGS`, each
  with why) are left out in the driver and every Ray worker: that optional training engines are not installed (five
  in every process that imports verl), that the critic is disabled (GRPO's family has none; three a run), and
  torchdata's own deprecation inside verl's dataloader. egpo's trainer builds verl's ``RayPPOTrainer`` on purpose
  (``trainer.use_v1=false``) without verl's deprecation warning (:mod:`egpo.trainer.ray_trainer`). docs/cpu.md names
  what a CPU run still prints.

Anything else ``pprint`` is given is printed as it is.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from omegaconf import DictConfig

from egpo.patching import Patch

# (PYTHONWARNINGS filter, why it says nothing of this run): in Ray's workers as PYTHONWARNINGS, the same in the driver
EXPECTED_WARNINGS = (
    ("ignore::UserWarning:verl.workers.engine", "an optional training engine egpo does not use is not installed"),
    ("ignore:Disabled critic as algorithm.adv_estimator != gae:UserWarning", "GRPO's family trains without a critic"),
    ("ignore:'set_vital' is deprecated:UserWarning", "torchdata's deprecation, inside verl's dataloader"),
)
QUIET_WARNINGS = ",".join(spec for spec, _ in EXPECTED_WARNINGS)
VALIDATION_DUMPS = ("Initial validation metrics:", "Final validation metrics:")

_run: dict = {"config": None, "metrics": None}  # where this process's run keeps them (set in verl's task runner)


def one_line_instead_of_a_dump(original, obj, *args, **kwargs):
    """Around ``pprint``: verl's config and validation dumps become one line; anything else is printed as it is."""
    if _run["config"] is not None and isinstance(obj, dict) and {"actor_rollout_ref", "trainer", "algorithm"} <= set(obj):
        print(f"[egpo] the run's configuration: {_run['config']}", flush=True)
        return None
    if _run["metrics"] is not None and isinstance(obj, str) and obj.startswith(VALIDATION_DUMPS):
        if obj.startswith("Initial"):  # the final one is in the driver's closing summary, which ends the console
            print(f"[egpo] {obj.split(':', 1)[0].lower()}: every figure in {_run['metrics']}", flush=True)
        return None
    return original(obj, *args, **kwargs)


CONFIG_DUMP = Patch("pprint:pprint", one_line_instead_of_a_dump)  # TaskRunner.run imports it inside the method
VALIDATION_DUMP = Patch("verl.trainer.ppo.ray_trainer:pprint", one_line_instead_of_a_dump)  # imported at the top


WARNINGS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.PYTHONWARNINGS"


def quiet_driver() -> None:
    """In the driver, before anything imports verl: the filters Ray's workers get as PYTHONWARNINGS, read as Python
    reads that variable (the message's start, case-insensitive; the module's whole name)."""
    import builtins
    import re

    for spec, _ in EXPECTED_WARNINGS:
        action, message, category, module = (spec.split(":") + [""] * 3)[:4]
        warnings.filterwarnings(action, message=re.escape(message), category=getattr(builtins, category or "Warning"),
                                module=re.escape(module) + r"\Z" if module else "")


def quiet_workers(config: DictConfig) -> None:
    """Every Ray worker starts with the same filter (a preflight step: it completes the config)."""
    from omegaconf import OmegaConf, open_dict

    found = OmegaConf.select(config, WARNINGS_KEY, default=None)
    filters = [f for f in str(found or "").split(",") if f]
    missing = [spec for spec, _ in EXPECTED_WARNINGS if spec not in filters]
    if missing:
        with open_dict(config):
            OmegaConf.update(config, WARNINGS_KEY, ",".join([*filters, *missing]), force_add=True)


def fold_verls_dumps(config_file: Path | str | None, metrics_file: Path | str | None = None) -> None:
    """In verl's task-runner process: its dumps as one line each, naming the file the run keeps the configuration in
    (and, for a run that validates, its metrics); nothing is folded for a run that keeps no configuration."""
    if config_file is not None:
        _run["config"], _run["metrics"] = config_file, metrics_file
        CONFIG_DUMP.apply()
        VALIDATION_DUMP.apply()
