"""A main job's console: what verl prints at length is kept in the run directory and said in one line.

In verl's task-runner process (egpo's runner, before verl's ``run``), for a run with a run directory
(:mod:`egpo.run_dir`):

* verl's dump of the whole configuration (``pprint`` in ``TaskRunner.run``, about 900 lines) becomes one line naming
  the run's ``config.yaml``;
* verl's dump of the validation metrics before training (``pprint`` in ``RayPPOTrainer.fit``, about 50 lines)
  becomes one line naming ``metrics.jsonl``; the dump after training is left to the driver's closing summary (pass@k,
  and where every figure is), which ends the console;
* verl's warnings that optional training engines (torchtitan, veomni, automodel, mindspeed, megatron) are not
  installed, five in every process that imports verl, are left out (:data:`QUIET_WARNINGS`, set for the driver and
  every Ray worker).

Anything else ``pprint`` is given is printed as it is.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from omegaconf import DictConfig

from egpo.patching import Patch

# PYTHONWARNINGS for Ray's workers, and the same filter in the driver: verl.workers.engine warns once per engine
QUIET_WARNINGS = "ignore::UserWarning:verl.workers.engine"
VALIDATION_DUMPS = ("Initial validation metrics:", "Final validation metrics:")

_run: dict = {"dir": None}  # this process's run directory (set in verl's task-runner process)


def one_line_instead_of_a_dump(original, obj, *args, **kwargs):
    """Around ``pprint``: verl's config and validation dumps become one line; anything else is printed as it is."""
    where = _run["dir"]
    if where is not None and isinstance(obj, dict) and {"actor_rollout_ref", "trainer", "algorithm"} <= set(obj):
        print(f"[egpo] the run's configuration: {where / 'config.yaml'}", flush=True)
        return None
    if where is not None and isinstance(obj, str) and obj.startswith(VALIDATION_DUMPS):
        if obj.startswith("Initial"):  # the final one is in the driver's closing summary, which ends the console
            print(f"[egpo] {obj.split(':', 1)[0].lower()}: every figure in {where / 'metrics.jsonl'}", flush=True)
        return None
    return original(obj, *args, **kwargs)


CONFIG_DUMP = Patch("pprint:pprint", one_line_instead_of_a_dump)  # TaskRunner.run imports it inside the method
VALIDATION_DUMP = Patch("verl.trainer.ppo.ray_trainer:pprint", one_line_instead_of_a_dump)  # imported at the top


WARNINGS_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.PYTHONWARNINGS"


def quiet_driver() -> None:
    """In the driver, before anything imports verl."""
    warnings.filterwarnings("ignore", category=UserWarning, module="verl.workers.engine")


def quiet_workers(config: DictConfig) -> None:
    """Every Ray worker starts with the same filter (a preflight step: it completes the config)."""
    from omegaconf import OmegaConf, open_dict

    found = OmegaConf.select(config, WARNINGS_KEY, default=None)
    filters = [f for f in str(found or "").split(",") if f]
    if QUIET_WARNINGS not in filters:
        with open_dict(config):
            OmegaConf.update(config, WARNINGS_KEY, ",".join([*filters, QUIET_WARNINGS]), force_add=True)


def fold_verls_dumps(config: DictConfig) -> None:
    """In verl's task-runner process: its dumps as one line each, for a run with a run directory."""
    from egpo.run_dir import run_directory

    where = run_directory(config)
    if where is not None:
        _run["dir"] = Path(where)
        CONFIG_DUMP.apply()
        VALIDATION_DUMP.apply()
