"""egpo's options outside ``algorithm.*`` (which :class:`egpo.advantage.config.EgpoAlgorithmConfig` declares), declared
once, each a tree of dataclasses whose fields carry their default and their help:

* ``egpo.*`` (:class:`EgpoOptions`): the update probe (``egpo.probe.*``) and pass@k (``egpo.pass_at_k.*``);
* ``actor_rollout_ref.rollout.custom.*`` (:class:`RolloutCustom`): the rollout's seed and how its entropy is taken;
* ``egpo_demo.*`` (:class:`DemoOptions`): a recipe's demo model and task, built on first use.

Every reader goes through :func:`read` (a key no field declares is refused with the closest one, a value of another
type with the field's own words), the key check and the misspelled-override check list a tree's keys from it
(:func:`keys_by_node`), and the YAML that declares the defaults and the docs are tested equal to it
(``tests/test_options.py``).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any

from egpo.errors import EgpoConfigError
from egpo.typos import did_you_mean


def _key(default: Any, doc: str) -> Any:
    if is_dataclass(default):
        return field(default_factory=type(default), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


class OptionError(EgpoConfigError):
    """A key no field declares, or a value of another kind than the field's."""


@dataclass(frozen=True)
class ProbeOptions:
    enable: bool = _key(False, "measure each probed actor update's predicted and realised entropy change")
    every: int = _key(1, "probe every N-th actor update (>= 1)")
    realised: bool = _key(True, "also re-forward after the update to measure the realised change")
    attribution: bool = _key(False, "the same-prompt / cross-prompt split and the bias-free estimates (about 2x an "
                                    "update)")

    def __post_init__(self):
        if self.every < 1:
            raise OptionError(f"egpo.probe.every must be >= 1 (got {self.every})")

    @classmethod
    def from_config(cls, node) -> "ProbeOptions":
        """``egpo.probe`` (or the workers' copy of it) read from a node."""
        return read(cls, node, "egpo.probe")


@dataclass(frozen=True)
class PassAtKOptions:
    solved_score: float = _key(1.0, "the validation score at or above which a sample counts as solved (pass@k's, "
                                    "GTPO's and GRPO-S's one definition of correct)")


@dataclass(frozen=True)
class EgpoOptions:
    probe: ProbeOptions = _key(ProbeOptions(), "the update probe (off by default)")
    pass_at_k: PassAtKOptions = _key(PassAtKOptions(), "pass@k at every validation")


@dataclass(frozen=True)
class RolloutEntropyOptions:
    top_k: int = _key(0, "the entropy over the top-k logits (0: the full vocabulary)")
    temperature_scaled: bool = _key(False, "the entropy of logits / temperature (false: of the raw logits)")

    def __post_init__(self):
        if self.top_k < 0:
            raise OptionError(f"actor_rollout_ref.rollout.custom.entropy.top_k must be >= 0 (0 = full vocabulary); "
                              f"got {self.top_k}")


@dataclass(frozen=True)
class RolloutCustom:
    seed: int = _key(0, "the rollout's sampling seed where the engine has no seed of its own set")
    entropy: RolloutEntropyOptions = _key(RolloutEntropyOptions(), "how the rollout's entropy is taken")


@dataclass(frozen=True)
class DemoOptions:
    out: str = _key(".egpo_demo", "where the demo model, tokenizer and task are built (or the warm demo copied)")
    seed: int = _key(0, "the demo's seed")
    warm: bool = _key(False, "the warm demo (fine-tuned on reasoning traces before RL) instead of the random one")
    build_if_missing: bool = _key(False, "build (or copy) the demo on first use, before Ray starts (recipes/cpu/base.yaml "
                                         "sets it)")


TREES = {  # where each tree sits in a run's config
    "egpo": EgpoOptions,
    "actor_rollout_ref.rollout.custom": RolloutCustom,
    "egpo_demo": DemoOptions,
}

_KINDS = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}
_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}


def read(cls, node, prefix: str):
    """``cls`` from ``node`` (any mapping, or None: every default), checked: a key ``cls`` does not declare is
    refused with the closest one, a value of another kind with its key; an int given for a float is a float."""
    node = {} if node is None else node
    declared = [f.name for f in fields(cls)]
    unknown = [str(key) for key in node.keys() if str(key) not in declared]
    if unknown:
        raise OptionError("; ".join(f"unknown key {prefix}.{key}{did_you_mean(key, declared)}" for key in unknown)
                          + f"; the keys: {', '.join(declared)}")
    values = {}
    for f in fields(cls):
        if f.name not in node:
            continue
        value, key = node[f.name], f"{prefix}.{f.name}"
        if f.default_factory is not MISSING:  # a subtree (_key gives only those a factory)
            values[f.name] = read(f.default_factory, value, key)
            continue
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        kinds = _KINDS[kind]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise OptionError(f"{key} must be {_WORDS[kind]} (got {value!r}): {f.metadata['doc']}; the default is "
                              f"{f.default!r}")
        values[f.name] = float(value) if f.type == "float" else value
    return cls(**values)


def at(config, path: str):
    """The tree :data:`TREES` declares at ``path``, read from a run's ``config`` (None where the config has no such
    node)."""
    node = config
    for part in path.split("."):
        node = node.get(part, None) if node is not None else None
    return None if node is None else read(TREES[path], node, path)


def config_get(node, key, default=None):
    """``node[key]`` of a mapping (a DictConfig) or ``node.key`` of a config object (verl's RolloutConfig); ``default``
    where the node or its key is missing."""
    if node is None:
        return default
    if hasattr(node, "get"):
        return node.get(key, default)
    return getattr(node, key, default)


def rollout_custom(rollout) -> RolloutCustom:
    """egpo's keys of ``actor_rollout_ref.rollout.custom`` (``rollout``: a DictConfig or verl's RolloutConfig), read
    through :class:`RolloutCustom`; the rest of verl's ``custom`` node (another tool's keys) is left alone."""
    custom = config_get(rollout, "custom")
    declared = [f.name for f in fields(RolloutCustom)]
    mine = {key: config_get(custom, key) for key in declared if config_get(custom, key) is not None}
    return read(RolloutCustom, mine, "actor_rollout_ref.rollout.custom")


def defaults(cls) -> dict:
    """The tree's defaults as a nested mapping (the YAML that declares them is tested equal to it)."""
    return {f.name: defaults(f.default_factory) if f.default_factory is not MISSING else f.default
            for f in fields(cls)}


def keys_by_node(prefix: str, cls) -> dict[str, tuple[str, ...]]:
    """Each node of the tree (its dotted path) -> the keys it declares."""
    found = {prefix: tuple(f.name for f in fields(cls))}
    for f in fields(cls):
        if f.default_factory is not MISSING:
            found.update(keys_by_node(f"{prefix}.{f.name}", f.default_factory))
    return found


def documented(prefix: str, cls) -> dict[str, tuple[Any, str]]:
    """Each leaf key (its dotted path) -> (its default, its help), for the docs."""
    found = {}
    for f in fields(cls):
        if f.default_factory is not MISSING:
            found.update(documented(f"{prefix}.{f.name}", f.default_factory))
        else:
            found[f"{prefix}.{f.name}"] = (f.default, f.metadata["doc"])
    return found
