"""The entropy sources as one table (egpo/entropy_sources.py): every place that depends on the source derives from it,
and a source added to the table but not to where it must also be (its arm, its docs, its birthplace, its report
figure) fails here, each with what to add. docs/layout.md's recipe for a new source is this list."""

import re
from pathlib import Path

import pytest

from egpo.entropy_sources import DEFAULT_SOURCE, ENTROPY_SOURCES, SOURCES

ROOT = Path(__file__).resolve().parent.parent
EGPO = ROOT / "egpo"


def test_the_table_is_the_settings_allowed_values_and_its_keys_and_words():
    from egpo.advantage.config import ALGORITHM_DEFAULTS, EgpoAlgorithmConfig
    from egpo.keys import ENTROPY_KEY_BY_SOURCE, TRANSIENT_BATCH_KEYS
    from egpo.settings import SOURCE_WORDS

    assert ALGORITHM_DEFAULTS["entropy_source"] == DEFAULT_SOURCE == "actor"
    assert ENTROPY_KEY_BY_SOURCE == {name: s.batch_key for name, s in SOURCES.items()}
    assert set(TRANSIENT_BATCH_KEYS) == {s.batch_key for s in SOURCES.values() if s.egpo_key}
    assert set(SOURCE_WORDS) == set(SOURCES)
    for name in ENTROPY_SOURCES:
        assert EgpoAlgorithmConfig(entropy_source=name).entropy_source == name
    with pytest.raises(ValueError) as refused:
        EgpoAlgorithmConfig(entropy_source="surprise")
    assert "did you mean 'surprisal'" in str(refused.value)
    assert all(f"{s.name}: {s.help}" in str(refused.value) for s in SOURCES.values())


@pytest.mark.parametrize("name", ENTROPY_SOURCES)
def test_each_source_has_one_birthplace_an_arm_its_docs_and_its_messages(name):
    from egpo.ablation.arms import ARM_SETS, ARMS
    from egpo.settings import EgpoSettings

    source = SOURCES[name]
    # born in one place: the actor's recompute, the rollout engine's sampler, or verl's rollout log probs
    assert [source.from_recompute, source.from_engine, source.needs_log_probs].count(True) == 1, name
    assert source.negated == source.needs_log_probs  # a log prob is read negated, an entropy as it is
    # the key is written where the source is born (the trainer keeps the actor's, egpo's agent loop the engine's)
    if source.egpo_key:
        born = EGPO / ("trainer/ray_trainer.py" if source.from_recompute else "rollout/agent_loop.py")
        constant = {s.batch_key: k for k, s in (("ACTOR_ENTROPY", SOURCES["actor"]),
                                                 ("ROLLOUT_ENTROPY", SOURCES["rollout"]))}.get(source.batch_key)
        assert constant and constant in born.read_text(), f"{name}: its key is put into the batch in {born}"
    # its arm, in the sources arm set: the ablation compares every source
    arm = f"egpo_{name}"
    assert f"algorithm.entropy_source={name}" in ARMS[arm], f"add the arm {arm} to egpo/ablation/arms.py"
    assert arm in ARM_SETS["sources"], f"add {arm} to ARM_SETS['sources'] (egpo/ablation/arms.py)"
    # documented where a user chooses it
    assert re.search(rf"entropy_source=`?{name}\b", (ROOT / "docs/configuration.md").read_text()), \
        f"docs/configuration.md: say what algorithm.entropy_source={name} reads"
    # its settings' questions and its messages
    settings = EgpoSettings.from_algorithm({"adv_estimator": "egpo", "entropy_source": name})
    assert settings.entropy_key == source.batch_key and settings.actor_entropy_use == source.actor_entropy_use
    assert settings.reads_rollout_entropy == source.from_engine and settings.reads_surprisal == source.needs_log_probs
    from egpo.trainer.advantage_step import missing_entropy_message, variant_metrics

    message = missing_entropy_message(settings)
    assert f"entropy_source={name}" in message and "{" not in message
    flags = variant_metrics(settings)
    assert {k for k, v in flags.items() if k.startswith("egpo/entropy_source_is_") and v} == \
        (set() if name == DEFAULT_SOURCE else {f"egpo/entropy_source_is_{name}"})


@pytest.mark.parametrize("name", [n for n in ENTROPY_SOURCES if SOURCES[n].agreement_prefix])
def test_a_source_beside_the_actor_has_its_agreement_in_the_report(name):
    from egpo.report import METRICS

    prefix = SOURCES[name].agreement_prefix
    assert any(metric.startswith(prefix) for metric in METRICS), \
        f"egpo/report.py's METRICS: a title for {prefix}... (how far {name}'s entropy is from the actor's)"


@pytest.mark.parametrize("name", ENTROPY_SOURCES)
def test_the_preflight_counts_each_sources_own_tensor_on_the_driver(name):
    """The driver's figure (egpo.preflight.scale) holds the source's own tensor where egpo adds it: the actor's entropy
    kept, the engine's entropy, the surprisal's negation."""
    from hydra import compose, initialize_config_dir

    from egpo.preflight.scale import _driver_parts
    from egpo.settings import EgpoSettings

    with initialize_config_dir(config_dir=str(ROOT / "recipes"), version_base=None):
        config = compose(config_name="cpu_smoke", overrides=[
            f"algorithm.entropy_source={name}", "actor_rollout_ref.rollout.name=hf",
            "++actor_rollout_ref.rollout.calculate_log_probs=true"])
    parts = dict(_driver_parts(config, EgpoSettings.from_algorithm(config.algorithm), "hf"))
    assert SOURCES[name].cost_words in parts, (name, parts)
    cells = int(config.data.train_batch_size) * int(config.actor_rollout_ref.rollout.n) * \
        int(config.data.max_response_length)
    assert parts[SOURCES[name].cost_words] == cells * SOURCES[name].driver_bytes
