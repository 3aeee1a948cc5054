"""egpo's options outside algorithm.* declared once (egpo/options.py): the YAML that sets their defaults, the docs
that list them, the key check and every reader agree with the declaration."""

from pathlib import Path

import pytest
import yaml

from egpo.options import (TREES, DemoOptions, EgpoOptions, OptionError, PassAtKOptions, ProbeOptions, RolloutCustom,
                          at, defaults, documented, keys_by_node, read)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "egpo" / "config" / "egpo"


def test_the_yaml_defaults_are_the_declared_ones():
    assert yaml.safe_load((CONFIG / "probe.yaml").read_text()) == defaults(ProbeOptions)
    assert yaml.safe_load((CONFIG / "rollout.yaml").read_text())["custom"] == defaults(RolloutCustom)
    demo = yaml.safe_load((ROOT / "recipes" / "cpu" / "base.yaml").read_text())["egpo_demo"]
    assert set(demo) == set(defaults(DemoOptions))  # the CPU recipes set every demo key


def test_the_trees_as_a_run_composes_them():
    """egpo_trainer (verl's config plus egpo's) holds each tree at its place, with the declared defaults."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="egpo.config", version_base=None):
        config = compose(config_name="egpo_trainer")
    assert at(config, "egpo") == EgpoOptions()
    assert at(config, "actor_rollout_ref.rollout.custom") == RolloutCustom()
    assert at(config, "egpo_demo") is None  # a GPU recipe builds no demo


@pytest.mark.parametrize("path", sorted(TREES))
def test_every_leaf_key_is_in_the_docs_with_its_default(path):
    """A row `| key | default | ...` in docs/configuration.md's tables (the rollout's under actor_rollout_ref.rollout)."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    for key, (default, _) in documented(path, TREES[path]).items():
        short = key.removeprefix("actor_rollout_ref.rollout.")
        shown = "true" if default is True else "false" if default is False else str(default)
        assert f"| `{short}` | `{shown}` |" in text, f"docs/configuration.md: a row for {key}, default {shown}"


def test_a_reader_refuses_an_unknown_key_with_the_closest_and_a_value_of_another_kind():
    with pytest.raises(OptionError, match=r"unknown key egpo.probe.atribution \(did you mean 'attribution'\?\); the keys: enable, every"):
        read(ProbeOptions, {"atribution": True}, "egpo.probe")
    with pytest.raises(OptionError, match=r"egpo.pass_at_k.solved_score must be a number \(got 'full'\)"):
        read(EgpoOptions, {"pass_at_k": {"solved_score": "full"}}, "egpo")
    with pytest.raises(OptionError, match="egpo.probe.every must be true or false|egpo.probe.every must be an integer"):
        read(ProbeOptions, {"every": True}, "egpo.probe")
    with pytest.raises(OptionError, match="every must be >= 1"):
        read(ProbeOptions, {"every": 0}, "egpo.probe")
    assert read(PassAtKOptions, {"solved_score": 3}, "egpo.pass_at_k").solved_score == 3.0  # an int for a float
    assert read(EgpoOptions, {"probe": {"enable": True}}, "egpo").probe == ProbeOptions(enable=True)


def test_the_key_check_lists_the_declared_keys_of_each_node():
    from egpo.preflight.key_check import EGPO_KEYS, PASS_AT_K_KEYS
    from egpo.probe.settings import KNOWN

    nodes = keys_by_node("egpo", EgpoOptions)
    assert EGPO_KEYS == nodes["egpo"] == ("probe", "pass_at_k")
    assert PASS_AT_K_KEYS == nodes["egpo.pass_at_k"] and KNOWN == set(nodes["egpo.probe"])


def test_the_readers_read_through_the_declaration():
    from egpo.compat.seeds import sglang_replica_seed
    from egpo.probe.settings import ProbeSettings
    from egpo.rollout.entropy import EntropyOptions
    from egpo.trainer.pass_at_k import DEFAULT_SOLVED_SCORE

    assert ProbeSettings.from_config(None) == ProbeOptions() and DEFAULT_SOLVED_SCORE == PassAtKOptions().solved_score
    assert EntropyOptions.from_config({"top_k": 5, "temperature_scaled": True}) == EntropyOptions(5, True)
    with pytest.raises(OptionError, match="custom.entropy.top_k must be an integer"):
        EntropyOptions.from_config({"top_k": "5"})
    assert sglang_replica_seed({"custom": {}}, 3) == 3 + RolloutCustom().seed
    assert sglang_replica_seed({"custom": {"seed": 5, "their_own_key": 1}}, 3) == 8  # another tool's key left alone
    with pytest.raises(OptionError, match="custom.seed must be an integer"):
        sglang_replica_seed({"custom": {"seed": "5"}}, 3)
