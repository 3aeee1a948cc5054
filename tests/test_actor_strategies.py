"""Each actor strategy verl 0.9.1 ships, as verl's example scripts select it (``model_engine=...`` on verl's
``ppo_trainer``), under egpo's estimator: egpo sets the fp32 entropy through the key that strategy's engine reads
(verl's table, egpo.compat.versions), verl's own config classes accept the result, and the attention finding reads
that strategy's own attention setting."""

import pytest
from omegaconf import OmegaConf

from conftest import VERL
from egpo.preflight.compose import compose
from egpo.settings import EgpoSettings
from egpo.preflight.run_facts import with_facts

pytestmark = pytest.mark.skipif(VERL != "0.9.1", reason="VeOmni and TorchTitan actors are verl 0.9.1's")

ACTOR = "actor_rollout_ref.actor"


def example(model_engine, *more):
    """The launch line of verl's example scripts for that engine (their keys only), plus egpo's estimator."""
    return compose(None, "ppo_trainer", [f"model_engine={model_engine}", "algorithm.adv_estimator=egpo",
                                         "actor_rollout_ref.model.use_remove_padding=true",
                                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", *more],
                   echo=lambda _: None)


@pytest.mark.parametrize("model_engine, chunked, compiled", [
    ("dp", f"{ACTOR}.entropy_from_logits_with_chunking", f"{ACTOR}.fsdp_config.use_torch_compile"),
    ("veomni", f"{ACTOR}.veomni.entropy_from_logits_with_chunking", f"{ACTOR}.veomni.use_torch_compile"),
    ("torchtitan", f"{ACTOR}.torchtitan.entropy_from_logits_with_chunking", f"{ACTOR}.torchtitan.use_torch_compile"),
])
def test_each_strategy_gets_fp32_entropy_through_its_own_key_and_verl_accepts_it(model_engine, chunked, compiled):
    from verl.utils.config import omega_conf_to_dataclass

    from egpo.preflight.actor_entropy import actor_entropy_precision, prepare_actor_entropy

    config = example(model_engine, f"++{compiled}=true")
    settings = EgpoSettings.from_algorithm(config.algorithm)
    said = []
    assert actor_entropy_precision(config) != "fp32"  # verl's defaults: the entropy of the bf16 logits
    assert prepare_actor_entropy(*with_facts(config, settings=settings, say=said.append)) == []
    assert OmegaConf.select(config, chunked) is True and OmegaConf.select(config, compiled) is False
    assert actor_entropy_precision(config) == "fp32" and any(chunked in line for line in said)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)  # verl's own actor config class takes it
    engine_config = actor.engine if model_engine != "dp" else actor.fsdp_config
    assert engine_config.entropy_from_logits_with_chunking is True and engine_config.use_torch_compile is False
    if model_engine != "dp":  # no FSDP-only key was added to an actor class that has none
        assert "entropy_from_logits_with_chunking" not in config.actor_rollout_ref.actor


def test_megatron_needs_nothing_set():
    from egpo.preflight.actor_entropy import actor_entropy_precision, prepare_actor_entropy

    config = example("megatron")
    before = OmegaConf.to_container(config.actor_rollout_ref.actor)
    assert actor_entropy_precision(config) == "fp32"
    assert prepare_actor_entropy(*with_facts(config, settings=EgpoSettings.from_algorithm(config.algorithm), say=lambda _: None)) == []
    assert OmegaConf.to_container(config.actor_rollout_ref.actor) == before


def test_an_actor_strategy_without_an_entry_is_refused_in_one_line():
    from egpo.preflight.actor_entropy import prepare_actor_entropy

    config = example("dp")
    config.actor_rollout_ref.actor.strategy = "someone_elses"
    (finding,) = prepare_actor_entropy(*with_facts(config, settings=EgpoSettings.from_algorithm(config.algorithm), say=lambda _: None))
    assert finding.level == "error" and "strategy=someone_elses" in finding.text and "\n" not in finding.text
    assert finding.text.endswith(f"Fix: {ACTOR}.strategy=fsdp2")


@pytest.mark.parametrize("model_engine, more, key", [
    ("dp", [], "actor_rollout_ref.model.override_config.attn_implementation"),
    ("veomni", [], f"{ACTOR}.veomni.attn_implementation"),
    ("veomni", [f"{ACTOR}.veomni.attn_implementation=sdpa"], None),
    ("torchtitan", [], None),  # flex attention: PyTorch's own
])
def test_the_attention_finding_reads_the_strategys_own_setting(model_engine, more, key, monkeypatch):
    import importlib.util

    from egpo.preflight.stack import attention_finding

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    finding = attention_finding(*with_facts(example(model_engine, *more), cuda=True))
    if key is None:
        assert finding is None
    else:
        assert finding.level == "error" and finding.text.rstrip().endswith(f"{key}=sdpa"), finding.text


@pytest.mark.parametrize("model_engine", ["dp", "veomni", "torchtitan", "megatron"])
def test_egpos_whole_pass_refuses_nothing_verl_would_not(model_engine, demo):
    """egpo's pass before Ray (prepare, without the preflight's machine checks) on verl's example launch line of each
    strategy, with egpo's estimator and a local model holding Qwen3's thinking markers: no refusal; verl's own
    validation of the same config (which egpo's pass runs too) accepts it."""
    from egpo.preflight.batch import verl_validate_findings
    from egpo.preflight.prepare import prepare, refusal

    config = example(model_engine, f"actor_rollout_ref.model.path={demo / 'model'}", "data.train_batch_size=8",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=2",
                     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2")
    prepared = prepare(config, preflight=None, echo=lambda _: None)
    assert refusal(prepared.findings) is None, [f.text for f in prepared.findings if f.level == "error"]
    assert verl_validate_findings(prepared.config) == []
