"""The one door every entry point goes through before Hydra (:func:`door`: ``egpo.main``, and through
:func:`compose` ``egpo.preflight``, ``egpo.generate``, ``egpo.ablation`` and ``egpo.rehearse``), and a recipe plus
overrides composed as ``python -m egpo.main`` composes it, for the entry points that compose it themselves. Each
refusal is one line, printed by its caller."""

from __future__ import annotations

from pathlib import Path


def door(config_path: str | None, config_name: str | None, args: list[str], echo=print,
         refuse_appended: bool = True) -> tuple[str | None, str | None, list[str]]:
    """The checks every entry point runs before Hydra composes a recipe, written once, in one order; ``args``: the
    overrides (and, for ``egpo.main``, its flags); -> (config path, config name, args) as Hydra is to get them.

    1. The environment, from package metadata only (before anything imports verl).
    2. verl's trainer config names run as egpo's, said once (``echo``).
    3. A script's own ``hydra.searchpath`` keeps its entries, egpo's after them, said once.
    4. A recipe name no file holds, and a misspelled ``algorithm.*``/``egpo.*`` key, refused.

    ``refuse_appended``: a misspelled key given with ``+`` is refused here too (``egpo.main``: nothing starts); where
    False (``egpo.preflight`` and the tools whose preflight lists every problem) it composes, and the pass lists it
    with the others. Refusals: :class:`IncompatibleDependencyError` (1), :class:`EgpoConfigError` (4), one line each."""
    from egpo.compat.versions import environment_problems
    from egpo.errors import EgpoConfigError, IncompatibleDependencyError
    from egpo.recipe_names import egpo_equivalent, recipe_name_problems, with_egpo_searchpath

    problems = environment_problems()
    if problems:
        raise IncompatibleDependencyError("; ".join(problems))
    config_path, config_name, note = egpo_equivalent(config_path, config_name)
    if note:
        echo(note)
    args, note = with_egpo_searchpath(list(args))
    if note:
        echo(note)
    from egpo.preflight.key_check import misspelled_override_problems

    checked = args if refuse_appended else [arg for arg in args if not arg.startswith("+")]
    problems = recipe_name_problems(config_path, config_name) + misspelled_override_problems(checked)
    if problems:
        raise EgpoConfigError("; ".join(problems))
    return config_path, config_name, args


def compose(config_path: str | None, config_name: str, overrides: list[str], echo=print):
    """The recipe and overrides through :func:`door` (a key given with ``+`` left to the pass), composed."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module

    from egpo.errors import EgpoConfigError

    config_path, config_name, overrides = door(config_path, config_name, overrides, echo, refuse_appended=False)
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
