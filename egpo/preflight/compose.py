"""A recipe plus overrides composed as ``python -m egpo.main`` composes it, for the entry points that compose it
themselves (``egpo.preflight``, ``egpo.generate``, ``egpo.ablation``): the environment checked first from package
metadata (as ``egpo.main`` does before anything imports verl), verl's trainer config names run as egpo's (with the
same note), a recipe name no file holds and a misspelled ``algorithm.*``/``egpo.*`` key refused; each refusal
one line, by its caller."""

from __future__ import annotations

from pathlib import Path


def compose(config_path: str | None, config_name: str, overrides: list[str], echo=print):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module

    from egpo.compat.versions import environment_problems
    from egpo.errors import EgpoConfigError, IncompatibleDependencyError
    from egpo.recipe_names import egpo_equivalent, recipe_name_problems, with_egpo_searchpath

    problems = environment_problems()
    if problems:
        raise IncompatibleDependencyError("; ".join(problems))
    config_path, config_name, note = egpo_equivalent(config_path, config_name)
    if note:
        echo(note)
    overrides, note = with_egpo_searchpath(list(overrides))
    if note:
        echo(note)
    from egpo.preflight.key_check import misspelled_override_problems

    # a misspelled key Hydra cannot compose (given without +) is refused here; one given with + composes, and the
    # pass lists it with every other problem
    unappended = [override for override in overrides if not override.startswith("+")]
    problems = recipe_name_problems(config_path, config_name) + misspelled_override_problems(unappended)
    if problems:
        raise EgpoConfigError("; ".join(problems))
    if config_path:
        with initialize_config_dir(config_dir=str(Path(config_path).resolve()), version_base=None):
            config = hydra_compose(config_name=config_name, overrides=overrides)
    else:
        with initialize_config_module(config_module="egpo.config", version_base=None):
            config = hydra_compose(config_name=config_name, overrides=overrides)
    from egpo.preflight.key_check import appended_typo_problems

    problems = appended_typo_problems(config, overrides)
    if problems:
        raise EgpoConfigError("; ".join(problems))
    return config
