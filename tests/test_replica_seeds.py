"""Each rollout replica's sampling seed derives from the run's seed as verl derives it (replica_rank + seed), never
one engine seed shared by every replica (egpo.compat.seeds, egpo's sglang server, the ablation's seed overrides)."""

import os

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from verl.utils.config import omega_conf_to_dataclass

from conftest import VERL
from egpo.compat.seeds import run_seed_overrides, shared_engine_seeds, sglang_replica_seed
from egpo.compat.versions import verl_stack


def rollout(*overrides):
    with initialize_config_module(config_module="egpo.config", version_base=None):
        cfg = compose(config_name="egpo_trainer", overrides=["actor_rollout_ref.rollout.name=sglang", *overrides])
    return cfg


def test_the_ablation_seed_is_verls_rollout_seed_and_no_engine_seed():
    from egpo.ablation import seed_overrides

    overrides = seed_overrides(7)
    assert not any("engine_kwargs" in o for o in overrides)  # one value for every replica: never
    cfg = rollout(*overrides)
    assert cfg.actor_rollout_ref.rollout.custom.seed == 7 and cfg.data.seed == 7
    key = verl_stack(VERL).rollout_seed_key
    if key is not None:
        assert OmegaConf.select(cfg, key) == 7
    assert shared_engine_seeds(cfg.actor_rollout_ref.rollout) == []


def test_sglang_servers_get_one_seed_per_replica_from_the_run_seed():
    """On verl's own rollout config object (what the server holds): replica_rank + the run's seed; a user's
    engine_kwargs.sglang.random_seed is kept."""
    config = omega_conf_to_dataclass(rollout(*run_seed_overrides(5)).actor_rollout_ref.rollout)
    assert [sglang_replica_seed(config, rank) for rank in range(3)] == [5, 6, 7]
    fixed = omega_conf_to_dataclass(rollout("++actor_rollout_ref.rollout.engine_kwargs.sglang.random_seed=3")
                                    .actor_rollout_ref.rollout)
    assert sglang_replica_seed(fixed, 2) is None
    assert shared_engine_seeds(fixed) == ["actor_rollout_ref.rollout.engine_kwargs.sglang.random_seed"]


def test_egpos_sglang_server_sets_the_seed_and_chunked_log_probs(monkeypatch):
    from sglang_required import require_sglang

    require_sglang()
    from egpo.rollout.sglang.server import add_replica_engine_settings
    from egpo.rollout.sglang.versions import CHUNKED_LOGPROBS_ENV

    monkeypatch.delenv(CHUNKED_LOGPROBS_ENV, raising=False)
    config = omega_conf_to_dataclass(rollout(*run_seed_overrides(5)).actor_rollout_ref.rollout)
    add_replica_engine_settings(config, 2)
    assert config.engine_kwargs["sglang"]["random_seed"] == 7
    assert os.environ[CHUNKED_LOGPROBS_ENV] == "1"
    # sglang's own reader of the variable sees it (0.5.6.post2: .value, 0.5.12: .get())
    from sglang.srt.environ import envs

    switch = getattr(envs, CHUNKED_LOGPROBS_ENV)
    assert (switch.get() if hasattr(switch, "get") else switch.value) is True
    # a value the user set is kept
    monkeypatch.setenv(CHUNKED_LOGPROBS_ENV, "0")
    add_replica_engine_settings(config, 0)
    assert os.environ[CHUNKED_LOGPROBS_ENV] == "0"


@pytest.mark.parametrize("engine, key", [("vllm", "seed"), ("sglang", "random_seed")])
def test_a_shared_engine_seed_is_found(engine, key):
    cfg = rollout(f"++actor_rollout_ref.rollout.engine_kwargs.{engine}.{key}=1")
    assert shared_engine_seeds(cfg.actor_rollout_ref.rollout) == [f"actor_rollout_ref.rollout.engine_kwargs.{engine}.{key}"]
