"""Relative local paths in a config, made absolute against the directory the command runs in.

verl reads ``data.*_files`` and a local ``model.path`` inside Ray workers, whose working directory need not be the
driver's; ``python -m egpo.ablation`` starts each run in its own directory. Resolving once, in the driver, before
anything starts, makes ``data/math_train.parquet`` mean what it means where the user typed it.
"""

from __future__ import annotations

import os

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

DATA_KEYS = ("data.train_files", "data.val_files")
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "reward_model.model.path")


def is_local(path: str) -> bool:
    return "://" not in path


def _absolute(path: str, base: str) -> str:
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(base, path))


def data_paths(config: DictConfig, key: str) -> list[str]:
    value = OmegaConf.select(config, key, default=None)
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, ListConfig | list | tuple) else [str(value)]


def resolve_local_paths(config: DictConfig, base: str | None = None) -> None:
    """Data files: every relative local path. Model paths: a relative path that exists here (``Qwen/Qwen3-4B`` is a
    hub id unless a directory of that name is here)."""
    base = base or os.getcwd()
    with open_dict(config):
        for key in DATA_KEYS:
            value = OmegaConf.select(config, key, default=None)
            if value is None:
                continue
            paths = data_paths(config, key)
            resolved = [_absolute(p, base) if is_local(p) else p for p in paths]
            if resolved != paths:
                new = resolved if isinstance(value, ListConfig | list | tuple) else resolved[0]
                OmegaConf.update(config, key, new, merge=False)
        for key in MODEL_KEYS:
            path = OmegaConf.select(config, key, default=None, throw_on_missing=False)
            if isinstance(path, str) and is_local(path) and not os.path.isabs(os.path.expanduser(path)):
                candidate = _absolute(path, base)
                if os.path.exists(candidate):
                    OmegaConf.update(config, key, candidate, merge=False)
