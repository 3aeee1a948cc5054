"""``python -m egpo.main``: verl's PPO entry point with egpo's trainer and estimator.

    python -m egpo.main algorithm.adv_estimator=egpo algorithm.entropy_source=rollout ...

Before Hydra composes, verl's config names and misspelled keys on the command line are answered; before Ray starts,
:func:`egpo.preflight.prepare.prepare_config` completes and checks the config. Every refusal is printed as egpo's
own lines, with its fix, and exits non-zero without a traceback.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from egpo.errors import EgpoError


def run(config: DictConfig) -> None:
    # verl is imported here, after main() checked from package metadata that this environment can import it
    import ray
    from verl.trainer import main_ppo

    from egpo.advantage.registry import register as register_estimator
    from egpo.preflight.finished_run import finished_run
    from egpo.preflight.prepare import prepare_config
    from egpo.run_dir import RunOutputs
    from egpo.runner import EgpoTaskRunner
    from egpo.trainer.placement import OnDriverNode

    register_estimator()
    try:
        config = prepare_config(config)
    except EgpoError as err:  # egpo's refusal, as egpo's own lines: the message names the fix, a traceback adds nothing
        raise SystemExit(refusal(str(err))) from None
    finished = finished_run(config)
    if finished:
        print(finished, flush=True)
        return
    from egpo.cpu.vllm_rollout import SegmentsOfThisRun

    with SegmentsOfThisRun(config), RunOutputs(config):
        main_ppo.run_ppo(config, task_runner_class=OnDriverNode(ray.remote(num_cpus=1)(EgpoTaskRunner)))


def refusal(message: str) -> str:
    return f"[egpo] refused before anything started: {message}"


# verl's config names (Hydra accepts them with or without .yaml) with egpo's equivalent (verl's + egpo's keys)
EGPO_EQUIVALENTS = {"ppo_trainer": "egpo_trainer", "ppo_megatron_trainer": "egpo_megatron_trainer"}


def _config_args(argv: list[str]) -> tuple[str | None, str | None]:
    """``--config-name`` and ``--config-path`` (or ``--config-dir``) as Hydra reads them, ``=`` or space form."""
    args = iter(argv)
    name = path = None
    for arg in args:
        key, has_value, value = arg.partition("=")
        if key in ("--config-name", "-cn"):
            name = value if has_value else next(args, None)
        elif key in ("--config-path", "-cp", "--config-dir", "-cd"):
            path = value if has_value else next(args, None)
    return name, path


def verl_config_name_problems(argv: list[str]) -> list[str]:
    """``--config-name=ppo_trainer`` (verl's name, as verl's example scripts pass it) where Hydra would not find it:
    without ``--config-path``, or with one that holds no such file. Hydra would say only "Cannot find primary
    config"; egpo ships the same config with its keys under another name."""
    from egpo.recipe_names import recipe_folders

    name, path = _config_args(argv)
    stem = name[:-len(".yaml")] if name and name.endswith(".yaml") else name
    if stem not in EGPO_EQUIVALENTS:
        return []
    if path and any((folder / f"{stem}.yaml").is_file() for folder in recipe_folders(path)):
        return []  # the user's own copy
    where = f"it is not in --config-path={path}" if path else "egpo.main does not read verl's config folder"
    return [f"--config-name={name} is verl's config and {where}; egpo.main ships it with egpo's keys: "
            f"{'drop --config-path and ' if path else ''}use --config-name={EGPO_EQUIVALENTS[stem]}"]


@hydra.main(config_path="config", config_name="egpo_trainer", version_base=None)
def hydra_main(config: DictConfig) -> None:
    run(config)


def main() -> None:
    import sys

    from egpo.compat.versions import environment_problems

    argv = sys.argv[1:]
    problems = environment_problems()  # package metadata only: before anything imports verl
    if not problems:
        from egpo.preflight.key_check import misspelled_override_problems
        from egpo.recipe_names import recipe_name_problems

        name, path = _config_args(argv)
        problems = verl_config_name_problems(argv) or recipe_name_problems(path, name)
        problems += misspelled_override_problems(argv)
    if problems:
        raise SystemExit(refusal("; ".join(problems) + ". Nothing was started."))
    from egpo.console import quiet_driver

    quiet_driver()
    hydra_main()


if __name__ == "__main__":
    main()
