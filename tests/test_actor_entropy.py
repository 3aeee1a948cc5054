"""The actor's entropy as egpo reads it: in fp32, with no update-time entropy turned on (egpo.preflight.actor_entropy).

verl's plain ``entropy_from_logits`` works in the logits' dtype; its chunked one casts to fp32. With bf16 logits
the first is off by about 0.1 nat per token, which the float64 reference below shows on Qwen3-sized logits; egpo
turns the chunked one on wherever it reads the actor's entropy, or refuses the config with fixes that work.
"""

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.utils import torch_functional as verl_F

from egpo.settings import EgpoConfigError, EgpoSettings
from conftest import VERL
from egpo.preflight.findings import refuse
from egpo.preflight.actor_entropy import (CALCULATE, CHUNKED, actor_entropy_keys, actor_entropy_precision,
                                        prepare_actor_entropy, reads_actor_entropy)
from egpo.preflight.run_facts import with_facts


def config(*overrides, name="egpo_trainer"):
    with initialize_config_module(config_module="egpo.config", version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def prepared(*overrides, name="egpo_trainer"):
    cfg = config(*overrides, name=name)
    lines = []
    refuse(prepare_actor_entropy(*with_facts(cfg, settings=EgpoSettings.from_algorithm(cfg.algorithm), say=lines.append)))
    return cfg, lines


def entropy64(logits):
    x = logits.double()
    return torch.logsumexp(x, -1) - (torch.softmax(x, -1) * x).sum(-1)


def test_bf16_entropy_is_off_and_verls_chunked_entropy_is_fp32():
    """The premise, on logits shaped like Qwen3's (151,936 ids, logits around 20-40): verl's plain entropy of bf16
    logits is off by tenths of a nat, its chunked entropy (what egpo turns on) matches float64."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(16, 151_936, generator=g) * 3 + 25)
    logits[:, :8] += torch.linspace(12, 2, 8)  # a few likely tokens: entropies of a few nats down to ~0.5
    logits = logits.bfloat16()
    reference = entropy64(logits)
    plain = verl_F.entropy_from_logits(logits).double()
    chunked = verl_F.entropy_from_logits_with_chunking(logits, chunk_size=4).double()
    assert (plain - reference).abs().max() > 0.05
    # fp32 sums of 151,936 terms around 30: an error of ~1e-3 nat that follows the CPU's summation order (1.9e-3 on
    # an AVX-512 machine), an order of magnitude under bf16's
    torch.testing.assert_close(chunked, reference, rtol=0, atol=5e-3)


@pytest.mark.parametrize("source", ["actor", "rollout"])
def test_egpo_turns_on_fp32_entropy_uncompiled_and_never_the_update_entropy(source):
    """Chunked fp32 entropy, verl's compile of it off (it recompiles per token count), and calculate_entropy left
    false: that key would add a full-vocabulary entropy to every update micro-batch, which egpo never reads."""
    cfg, lines = prepared("algorithm.adv_estimator=egpo", f"algorithm.entropy_source={source}",
                          "actor_rollout_ref.model.use_remove_padding=true")
    assert OmegaConf.select(cfg, CHUNKED) is True and OmegaConf.select(cfg, CALCULATE) is False
    assert actor_entropy_precision(cfg) == "fp32"
    assert any(CHUNKED in line for line in lines)
    for key in actor_entropy_keys(cfg).compile:
        assert OmegaConf.select(cfg, key) is False, key
        assert any(key in line for line in lines)


@pytest.mark.parametrize("overrides", [
    ("algorithm.adv_estimator=grpo",),  # not egpo: verl's run as it is
    ("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout",  # no actor recompute
     "algorithm.rollout_correction.bypass_mode=true"),
])
def test_runs_that_read_no_actor_entropy_are_left_alone(overrides):
    before = config(*overrides)
    cfg, lines = prepared(*overrides)
    assert not reads_actor_entropy(EgpoSettings.from_algorithm(cfg.algorithm))
    assert OmegaConf.to_container(cfg.actor_rollout_ref) == OmegaConf.to_container(before.actor_rollout_ref)
    assert lines == []


@pytest.mark.parametrize("source", ["actor", "rollout"])
def test_padded_bf16_path_is_refused_and_each_fix_works(source):
    """verl's padded forward ignores the chunked entropy: refused, and each offered fix passes when applied."""
    overrides = ("algorithm.adv_estimator=egpo", f"algorithm.entropy_source={source}",
                 "actor_rollout_ref.model.use_remove_padding=false")
    with pytest.raises(EgpoConfigError, match="bf16") as err:
        prepared(*overrides)
    assert err.value.fixes
    for fix in err.value.fixes:
        cfg, _ = prepared(*overrides, *fix)
        assert actor_entropy_precision(cfg) == "fp32"
        assert OmegaConf.select(cfg, CALCULATE) is False


def test_fp32_forward_and_megatron_need_no_chunking():
    # egpo's CPU recipes: an fp32 forward (the padded path is exact there)
    cfg, lines = prepared("algorithm.adv_estimator=egpo", "actor_rollout_ref.model.use_remove_padding=false",
                          "++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32")
    assert actor_entropy_precision(cfg) == "fp32" and OmegaConf.select(cfg, CHUNKED) is False and lines == []
    assert OmegaConf.select(cfg, CALCULATE) is False
    # Megatron's Float16Module returns fp32 logits
    cfg, lines = prepared("algorithm.adv_estimator=egpo", name="egpo_megatron_trainer")
    assert actor_entropy_precision(cfg) == "fp32" and OmegaConf.select(cfg, CALCULATE) is False


ENGINE_071 = ("trainer.use_legacy_worker_impl=disable",)


@pytest.mark.skipif(VERL != "0.7.1", reason="verl 0.7.1's engine workers (trainer.use_legacy_worker_impl=disable)")
def test_verl_071s_engine_reads_its_fsdp_configs_keys_and_autocasts_to_bf16():
    """verl 0.7.1's engine worker builds its engine from ``actor.fsdp_config``, whose chunking key is not linked to the
    actor's, and its forward autocasts to bf16 whatever ``param_dtype`` says: egpo turns on the FSDP config's key, and
    an fp32 param dtype without remove-padding is refused."""
    import inspect

    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    # verl's own config and source, the premise
    plain = config("actor_rollout_ref.actor.entropy_from_logits_with_chunking=true")
    engine_config = omega_conf_to_dataclass(plain.actor_rollout_ref.actor.fsdp_config)
    assert engine_config.entropy_from_logits_with_chunking is False
    assert "torch.autocast(device_type=device_name, dtype=torch.bfloat16)" in inspect.getsource(FSDPEngineWithLMHead)

    cfg, lines = prepared("algorithm.adv_estimator=egpo", "actor_rollout_ref.model.use_remove_padding=true", *ENGINE_071)
    keys = actor_entropy_keys(cfg)
    assert keys.chunked == "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking"
    assert omega_conf_to_dataclass(cfg.actor_rollout_ref.actor.fsdp_config).entropy_from_logits_with_chunking is True
    assert OmegaConf.select(cfg, "actor_rollout_ref.actor.fsdp_config.use_torch_compile") is False
    assert actor_entropy_precision(cfg) == "fp32" and any(keys.chunked in line for line in lines)
    with pytest.raises(EgpoConfigError, match="bf16"):
        prepared("algorithm.adv_estimator=egpo", "actor_rollout_ref.model.use_remove_padding=false",
                 "++actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32", *ENGINE_071)
