"""Which recipe a command names, read the same way by every entry point (``egpo.main``, ``egpo.preflight``,
``egpo.generate``, ``egpo.ablation``) before anything composes it: verl's trainer config names run as egpo's
(:func:`egpo_equivalent`), and a name no file holds is one refusal naming the recipes that folder does hold and the one
most likely meant. Reads file names only: nothing heavy is imported."""

from __future__ import annotations

import difflib
from importlib.util import find_spec
from pathlib import Path

EGPO_CONFIGS = Path(__file__).resolve().parent / "config"


def _verl_configs() -> Path | None:
    """verl's trainer configs (``pkg://verl.trainer.config``, on egpo's search path), found without importing verl."""
    spec = find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def recipe_folders(config_path: str | None) -> list[Path]:
    """Where a ``--config-path`` may point (the working directory's, then egpo.main's folder's, as Hydra resolves a
    relative one), or egpo's own configs without one."""
    if not config_path:
        return [EGPO_CONFIGS]
    path = Path(config_path).expanduser()
    return [path] if path.is_absolute() else [Path.cwd() / path, EGPO_CONFIGS.parent / path]


# verl's trainer configs (verl's example scripts pass them) and egpo's: the same config with egpo's keys
VERL_EQUIVALENTS = {"ppo_trainer": "egpo_trainer", "ppo_megatron_trainer": "egpo_megatron_trainer"}


def config_args(argv: list[str]) -> tuple[str | None, str | None]:
    """``--config-path`` (or ``--config-dir``) and ``--config-name`` as Hydra reads them, ``=`` or space form."""
    args = iter(argv)
    name = path = None
    for arg in args:
        key, has_value, value = arg.partition("=")
        if key in ("--config-name", "-cn"):
            name = value if has_value else next(args, None)
        elif key in ("--config-path", "-cp", "--config-dir", "-cd"):
            path = value if has_value else next(args, None)
    return path, name


def without_config_args(argv: list[str]) -> list[str]:
    """``argv`` without its ``--config-path``/``--config-dir``/``--config-name`` (either form)."""
    kept, args = [], iter(argv)
    for arg in args:
        key, has_value, _ = arg.partition("=")
        if key in ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd"):
            if not has_value:
                next(args, None)
            continue
        kept.append(arg)
    return kept


def egpo_equivalent(config_path: str | None, config_name: str | None) -> tuple[str | None, str | None, str | None]:
    """-> (config path, config name, a note or None). verl's trainer config name (``--config-name=ppo_trainer``, with
    verl's ``--config-path=./config`` or none) becomes egpo's own config of that name, with one line saying so; a
    folder holding a file of that name (the user's own copy) keeps it."""
    stem = config_name[:-len(".yaml")] if config_name and config_name.endswith(".yaml") else config_name
    if stem not in VERL_EQUIVALENTS:
        return config_path, config_name, None
    if config_path and any((folder / f"{stem}.yaml").is_file() for folder in recipe_folders(config_path)):
        return config_path, config_name, None
    ours = VERL_EQUIVALENTS[stem]
    return None, ours, (f"[egpo] --config-name={config_name} is verl's trainer config: egpo runs its own {ours} "
                        f"(verl's {stem} with egpo's keys{', in place of --config-path=' + config_path if config_path else ''})")


def recipe_name_problems(config_path: str | None, config_name: str | None) -> list[str]:
    """[] where a file holds ``--config-name`` (in the recipe folder, egpo's configs or verl's); else one line with
    the folder's recipes and the closest name."""
    if not config_name:
        return []
    stem = config_name[:-len(".yaml")] if config_name.endswith(".yaml") else config_name
    folders = recipe_folders(config_path)
    searched = [*folders, EGPO_CONFIGS, *filter(None, [_verl_configs()])]
    if any((folder / f"{stem}.yaml").is_file() for folder in searched):
        return []
    folder = next((f for f in folders if f.is_dir()), None)
    if folder is None:
        return [f"--config-path={config_path}: no such folder (a relative path is read from {Path.cwd()}); give the "
                f"recipe folder, e.g. --config-path=\"$PWD/recipes\""]
    recipes = sorted(p.stem for p in folder.glob("*.yaml"))
    closest = difflib.get_close_matches(stem, recipes, n=1, cutoff=0.5)
    where = f"--config-path={config_path}" if config_path else "egpo's own configs"
    hint = f"did you mean --config-name={closest[0]}? " if closest else ""
    return [f"--config-name={config_name}: no such recipe in {where} ({folder}); {hint}"
            f"the recipes there: {', '.join(recipes) or 'none'}"]


# the config packages every egpo config composes from (egpo's and verl's trainer configs), kept on the search path
# beside a command line's own ``hydra.searchpath`` (verl's Megatron-Lite examples pass one), which would replace them
EGPO_SEARCHPATH = ("pkg://egpo.config", "pkg://verl.trainer.config")


def with_egpo_searchpath(argv: list[str]) -> tuple[list[str], str | None]:
    """-> (argv, a note or None). A ``hydra.searchpath=[...]`` override (read with Hydra's own override parser) keeps
    its own entries, in its order, with :data:`EGPO_SEARCHPATH` after them (Hydra looks in the primary config's folder
    first, then the search path in order, so a script's own package still wins over verl's for a config both hold). A
    value that is not a list (an interpolation, say) is passed to Hydra untouched."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, kept, added = None, [], []
    for arg in argv:
        if arg.partition("=")[0].lstrip("+") == "hydra.searchpath" and "=" in arg:
            parser = parser or OverridesParser.create()
            override = parser.parse_override(arg)
            entries = override.value()
            missing = [entry for entry in EGPO_SEARCHPATH if entry not in entries] if isinstance(entries, list) else []
            if missing:
                added += missing
                arg = f"{override.get_key_element()}=[{','.join([*map(str, entries), *missing])}]"
        kept.append(arg)
    note = (f"[egpo] hydra.searchpath: {', '.join(added)} kept after the command line's own entries (egpo's configs "
            "compose from them)") if added else None
    return kept, note
