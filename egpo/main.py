"""``python -m egpo.main``: verl's PPO entry point with egpo's trainer and estimator.

    python -m egpo.main algorithm.adv_estimator=egpo algorithm.entropy_source=rollout ...

Before Hydra composes, the recipe's name is read (verl's trainer config names run as egpo's, with a note) and
misspelled keys on the command line are answered; before Ray starts,
:func:`egpo.preflight.prepare.prepare_config` completes and checks the config. Every refusal is printed as egpo's
own lines, with its fix, and exits non-zero without a traceback.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from egpo.errors import EgpoError


def run(config: DictConfig) -> None:
    # verl is imported here, after main() checked from package metadata that this environment can import it
    from egpo.advantage.registry import register as register_estimator
    from egpo.preflight.finished_run import finished_run
    from egpo.preflight.prepare import prepare_config
    from egpo.runs.main_dir import RunOutputs
    from egpo.runner import EgpoTaskRunner, launch

    register_estimator()
    try:
        refuse_appended_typos(config)
        config = prepare_config(config)
    except EgpoError as err:  # egpo's refusal, as egpo's own lines: the message names the fix, a traceback adds nothing
        clear_refused_runs_hydra_folder()  # nothing was started: nothing is left either
        raise SystemExit(refusal(str(err))) from None
    finished = finished_run(config)
    if finished:
        print(finished, flush=True)
        return
    with RunOutputs(config):
        launch(config, EgpoTaskRunner)


def refuse_appended_typos(config: DictConfig) -> None:
    """A key appended with ``+`` within a typo of one verl reads (Hydra's own advice for a misspelled key) is refused,
    with the key meant: read from the overrides Hydra composed."""
    from hydra.core.hydra_config import HydraConfig

    from egpo.errors import EgpoConfigError
    from egpo.preflight.key_check import appended_typo_problems

    problems = appended_typo_problems(config, list(HydraConfig.get().overrides.task)) if HydraConfig.initialized() \
        else []
    if problems:
        raise EgpoConfigError("; ".join(problems))


# Hydra's own output (.hydra/ and its log) goes into the run directory, not an outputs/ folder in the working directory
HYDRA_RUN_DIR = "hydra.run.dir=${trainer.default_local_dir}/hydra"


# Hydra's flags that take a value as the next argument, and those with which nothing runs
VALUE_FLAGS = ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd", "--cfg", "-c", "--package", "-p",
               "--experimental-rerun", "--info", "-i")
NO_RUN_FLAGS = ("--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc")


def with_hydras_folder_in_the_run(argv: list[str]) -> list[str]:
    """``argv`` with Hydra's folder in the run directory, unless the command line names one or runs nothing. Hydra
    reads its overrides as one run of positional arguments: the override joins that run (after its last one)."""
    flags = [arg.split("=", 1)[0] for arg in argv if arg.startswith("-")]
    if any(arg.lstrip("+").startswith("hydra.run.dir=") for arg in argv) or set(flags) & set(NO_RUN_FLAGS):
        return argv
    positional, value_next = [], False
    for i, arg in enumerate(argv):
        if value_next:
            value_next = False
        elif arg.startswith("-"):
            value_next = "=" not in arg and arg in VALUE_FLAGS
        else:
            positional.append(i)
    at = positional[-1] + 1 if positional else len(argv)
    return [*argv[:at], HYDRA_RUN_DIR, *argv[at:]]


def clear_refused_runs_hydra_folder() -> None:
    """A refused run's Hydra folder, and the folders above it that held nothing else, up to the working directory;
    where the run directory holds an earlier attempt's files, its Hydra folder is that run's and stays."""
    import shutil
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    folder = Path(HydraConfig.get().runtime.output_dir).resolve()
    here = Path.cwd().resolve()
    if folder == here or here not in folder.parents or any(p != folder for p in folder.parent.iterdir()):
        return
    shutil.rmtree(folder, ignore_errors=True)
    for parent in folder.parents:
        if parent == here or any(parent.iterdir()):
            break
        parent.rmdir()


def refusal(message: str) -> str:
    return f"[egpo] refused before anything started: {message}"


@hydra.main(config_path="config", config_name="egpo_trainer", version_base=None)
def hydra_main(config: DictConfig) -> None:
    run(config)


def main() -> None:
    import sys

    from egpo.preflight.compose import door
    from egpo.recipe_names import config_args, without_config_args

    argv = sys.argv[1:]
    path, name = config_args(argv)
    try:  # notes go to stderr: with --cfg job (or --help) stdout is the product, a YAML file say
        to_path, to_name, argv = door(path, name, argv, echo=lambda note: print(note, file=sys.stderr, flush=True))
    except EgpoError as err:
        raise SystemExit(refusal(f"{err}. Nothing was started.")) from None
    if (to_path, to_name) != (path, name):  # verl's example scripts' --config-name: egpo's config of that name
        argv = [*without_config_args(argv), *([f"--config-path={to_path}"] if to_path else []),
                f"--config-name={to_name}"]
    sys.argv[1:] = with_hydras_folder_in_the_run(argv)
    from egpo.console import quiet_driver

    quiet_driver()
    hydra_main()


if __name__ == "__main__":
    main()
