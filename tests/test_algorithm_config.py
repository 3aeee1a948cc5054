"""egpo's ``algorithm.*`` keys declared once (egpo.advantage.config.EgpoAlgorithmConfig): the YAML that merges them
into verl's config, the docs' table, the unknown-key check and the settings all agree with the declaration."""

import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from egpo.advantage.config import ALGORITHM_DEFAULTS, ALGORITHM_KEYS, EgpoAlgorithmConfig
from egpo.settings import EgpoConfigError, EgpoSettings
from egpo.preflight.key_check import EGPO_ALGORITHM_KEYS

ROOT = Path(__file__).resolve().parents[1]


def test_the_yaml_declares_exactly_the_keys_and_defaults():
    declared = yaml.safe_load((ROOT / "egpo" / "config" / "egpo" / "algorithm.yaml").read_text())
    assert declared == ALGORITHM_DEFAULTS


def test_the_docs_table_gives_each_key_its_default():
    table = {}
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        match = re.match(r"\| `(\w+)` \| `([^`]+)` \|", line)
        if match:
            table[match.group(1)] = match.group(2)
    expected = {k: "null" if v is None else str(v) for k, v in ALGORITHM_DEFAULTS.items()}
    assert {k: table.get(k) for k in ALGORITHM_KEYS} == expected


def test_the_unknown_key_check_knows_every_declared_key():
    assert EGPO_ALGORITHM_KEYS == ALGORITHM_KEYS == tuple(f.name for f in fields(EgpoAlgorithmConfig))


def test_a_node_without_egpos_keys_reads_the_declared_defaults_and_settings_follow():
    algo = EgpoAlgorithmConfig.from_node({"adv_estimator": "egpo"})
    assert algo == EgpoAlgorithmConfig()
    settings = EgpoSettings.from_algorithm({"adv_estimator": "egpo"})
    assert (settings.algo.entropy_source, settings.algo.egpo_lambda, settings.algo.egpo_alpha, settings.algo.egpo_granularity, settings.algo.egpo_span,
            settings.algo.egpo_token_selection, settings.algo.egpo_top_entropy_quantile) == (
        "actor", 0.4, 2.0, "response", "cot", "all", 0.2)


def test_integers_read_as_numbers_and_bad_values_are_refused_naming_the_key():
    algo = EgpoAlgorithmConfig.from_node({"egpo_lambda": 0, "egpo_alpha": 1, "egpo_top_entropy_quantile": 1})
    assert (algo.egpo_lambda, algo.egpo_alpha, algo.egpo_top_entropy_quantile) == (0.0, 1.0, 1.0)
    assert all(isinstance(v, float) for v in (algo.egpo_lambda, algo.egpo_alpha, algo.egpo_top_entropy_quantile))
    for node, message in (({"egpo_lambda": "high"}, "algorithm.egpo_lambda must be a number"),
                          ({"egpo_lambda": True}, "algorithm.egpo_lambda must be a number"),
                          ({"egpo_lambda": 2.0}, "egpo_lambda must lie in"),
                          ({"entropy_source": "engine"}, "algorithm.entropy_source='engine' is not one of"),
                          ({"egpo_span": "thought"}, "algorithm.egpo_span='thought'"),
                          ({"egpo_top_entropy_quantile": 0}, "must lie in \\(0, 1\\]"),
                          ({"cot_start_token_id": 5, "cot_end_token_id": 5}, "must differ"),
                          ({"cot_start_token_id": -1}, "must be a token id")):
        with pytest.raises(ValueError, match=message):
            EgpoAlgorithmConfig.from_node(node)
        with pytest.raises(EgpoConfigError, match=message):
            EgpoSettings.from_algorithm({"adv_estimator": "egpo", **node})


@pytest.mark.parametrize("node, meant", [({"entropy_source": "rollot"}, "'rollout'"),
                                         ({"entropy_source": "actr"}, "'actor'"),
                                         ({"egpo_span": "respose"}, "'response'"),
                                         ({"egpo_granularity": "tokens"}, "'token'"),
                                         ({"egpo_token_selection": "top_entropy_per_reponse"},
                                          "'top_entropy_per_response'"),
                                         ({"egpo_token_reweighting": "stair"}, "'stare'"),
                                         ({"stare_variant": "c2"}, "'C2'")])
def test_a_misspelled_value_is_answered_with_the_value_meant(node, meant):
    (key, value), = node.items()
    with pytest.raises(ValueError, match=f"algorithm.{key}='{value}' is not one of [^(]*\\(did you mean {meant}\\?\\)"):
        EgpoAlgorithmConfig.from_node(node)


def test_a_value_within_no_typo_of_any_gets_the_list_alone():
    with pytest.raises(ValueError) as err:
        EgpoAlgorithmConfig.from_node({"entropy_source": "engine"})
    assert "did you mean" not in str(err.value) and "'actor', 'rollout', 'surprisal'" in str(err.value)
