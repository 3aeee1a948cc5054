"""Misspelled keys never train silently: unknown keys under ``algorithm`` and ``egpo`` are refused at start-up.

verl never turns the ``algorithm`` node into its dataclass in the training flow, so ``+algorithm.egpo_lamda=0.3``
would run a whole job with the default ``egpo_lambda``. Every top-level key of ``algorithm`` must be one verl's
``AlgoConfig`` or egpo's ``EgpoAlgorithmConfig`` declares; every key under ``egpo`` one egpo declares. The error
names the closest known key ("did you mean ...").
"""

from __future__ import annotations

import dataclasses
import difflib

from omegaconf import DictConfig, ListConfig, OmegaConf

from egpo.advantage.config import ALGORITHM_KEYS
from egpo.options import EgpoOptions, OptionError, keys_by_node, read
from egpo.preflight.findings import Finding, error

EGPO_ALGORITHM_KEYS = ALGORITHM_KEYS  # declared once, in egpo.advantage.config
EGPO_NODES = keys_by_node("egpo", EgpoOptions)  # egpo.* (egpo.options): each node -> the keys it declares
EGPO_KEYS = EGPO_NODES["egpo"]
PASS_AT_K_KEYS = EGPO_NODES["egpo.pass_at_k"]


def verl_algorithm_keys() -> tuple[str, ...]:
    from verl.trainer.config import AlgoConfig

    return tuple(f.name for f in dataclasses.fields(AlgoConfig))


def _unknown(node, known: tuple[str, ...], prefix: str) -> list[str]:
    problems = []
    for key in node.keys():
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
        hint = f"did you mean {prefix}.{close[0]}?" if close else f"known keys: {', '.join(sorted(known))}"
        problems.append(f"{prefix}.{key} is not a key verl or egpo reads ({hint})")
    return problems


def _override_key(override: str) -> str | None:
    """The dotted key of a Hydra command-line override (``key=value``, ``+key=v``, ``++key=v``, ``~key``), or None
    for anything else (a flag, a config-group choice with ``@``)."""
    if override.startswith("-"):
        return None
    key, assigns, _ = override.lstrip("+~").partition("=")
    if not key or "@" in key or not (assigns or override.startswith("~")):
        return None
    return key


def misspelled_override_problems(overrides: list[str]) -> list[str]:
    """Command-line overrides of keys under ``algorithm`` or ``egpo`` that neither verl nor egpo declares, with the
    closest key: checked before Hydra composes, which would answer a key given without ``+`` by suggesting that the
    misspelled key be appended with ``+``."""
    known = {"algorithm": verl_algorithm_keys() + EGPO_ALGORITHM_KEYS, **EGPO_NODES}
    problems = []
    for override in overrides:
        key = _override_key(override)
        if key is None:
            continue
        parts = key.split(".")
        for depth in (2, 1):  # egpo.probe.x before egpo.x; algorithm's own keys (nested ones are verl's)
            prefix = ".".join(parts[:depth])
            if prefix in known and len(parts) > depth:
                problems += _unknown({parts[depth]: None}, known[prefix], prefix)
                break
    return problems


def check_unknown_keys(config: DictConfig, run=None) -> list[Finding]:
    problems = _unknown(config.algorithm, verl_algorithm_keys() + EGPO_ALGORITHM_KEYS, "algorithm")
    egpo = OmegaConf.select(config, "egpo", default=None)
    if egpo is not None:
        unknown = []
        for node, known in EGPO_NODES.items():
            held = OmegaConf.select(config, node, default=None)
            if isinstance(held, DictConfig):
                unknown += _unknown(held, known, node)
        problems += unknown
        if not unknown:  # each value of its declared kind and range (egpo.options)
            try:
                read(EgpoOptions, egpo, "egpo")
            except OptionError as err:
                problems.append(str(err))
    if problems:
        return [error("keys", "; ".join(problems) + ". Remove or rename the key(s); nothing was started.")]
    return []


# how close an appended key must be to one its node already holds to be read as a typo of it (a reward function's
# own kwargs, appended under an empty node or far from every key there, stay allowed)
TYPO_CUTOFF = 0.85
OWN_CHECKS = ("algorithm", "egpo")  # every key under these is checked against its declared list (above)


def appended_typo_problems(config: DictConfig, overrides: list[str]) -> list[str]:
    """Keys appended with ``+`` (Hydra's advice for a key the config lacks, which verl then never reads) that sit
    within a typo of a key their node already holds: ``+trainer.total_training_step=5`` would train verl's default
    step count without a word. One problem each, with the key meant."""
    appended = [key for key in (_override_key(o) for o in overrides if o.startswith("+") and not o.startswith("++"))
                if key and key.split(".")[0] not in OWN_CHECKS]
    new = set(appended)
    problems = []
    for key in appended:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(config, parent, default=None) if parent else config
        if not isinstance(node, DictConfig):
            continue
        siblings = [str(k) for k in node.keys() if f"{parent}.{k}".lstrip(".") not in new]
        close = difflib.get_close_matches(leaf, siblings, n=1, cutoff=TYPO_CUTOFF)
        if close:
            meant = f"{parent}.{close[0]}".lstrip(".")
            value = OmegaConf.select(config, meant, default=None, throw_on_resolution_failure=False)
            runs_with = "" if isinstance(value, (DictConfig, ListConfig)) else f": the run would keep {meant}={value}"
            problems.append(f"+{key} adds a key nothing reads, within a typo of {meant}{runs_with}; did you mean "
                            f"{meant}=... (without +)?")
    return problems
