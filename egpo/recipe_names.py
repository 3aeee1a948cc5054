"""Which recipe a command names, checked before anything composes it: the one refusal every entry point gives
(``egpo.main``, ``egpo.preflight``, ``egpo.generate``, ``egpo.ablation``) when no file holds the name, naming the
recipes that folder does hold and the one most likely meant. Reads file names only: nothing heavy is imported."""

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
