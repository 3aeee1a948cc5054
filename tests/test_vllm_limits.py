"""Settings under which vLLM cannot return per-token entropy are refused, each with its fix (no vLLM needed)."""

import pytest
from omegaconf import OmegaConf

from egpo.rollout.vllm.limits import UnsupportedVllmSettingError, refuse_unsupported_settings, unsupported_settings


def rollout(**values):
    base = {"pipeline_model_parallel_size": 1, "engine_kwargs": {"vllm": {}}, "mtp": None}
    return OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(values))


@pytest.mark.parametrize("version", ["0.12.0", "0.24.0", "0.33.0"])
def test_plain_settings_pass(version):
    assert unsupported_settings(rollout(), environ={}, vllm_version=version) == []
    assert unsupported_settings(rollout(engine_kwargs={"vllm": {"max_logprobs": 20}}), environ={
        "VLLM_USE_V2_MODEL_RUNNER": "0", "VLLM_PLUGINS": "lora_resolver,egpo_rollout_entropy"},
        vllm_version=version) == []


@pytest.mark.parametrize("version, served", [("0.12.0", False), ("0.24.0", True), ("0.29.0", True), ("0.33.0", True)])
def test_model_runner_v2_is_refused_only_where_egpo_does_not_patch_its_sampler(version, served):
    problems = unsupported_settings(rollout(), environ={"VLLM_USE_V2_MODEL_RUNNER": "1"}, vllm_version=version)
    assert (problems == []) == served
    if not served:
        assert "VLLM_USE_V2_MODEL_RUNNER=0" in problems[0]


def test_the_plugin_name_is_egpos_entry_point():
    import tomllib
    from pathlib import Path

    from egpo.rollout.vllm.limits import PLUGIN_NAME

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    plugins = pyproject["project"]["entry-points"]["vllm.general_plugins"]
    assert plugins[PLUGIN_NAME] == "egpo.rollout.vllm.plugin:load"
    # the other one is verl's vLLM path on a CPU (egpo.cpu.vllm_rollout), inactive off VERL_PLATFORM=cpu
    assert plugins == {PLUGIN_NAME: "egpo.rollout.vllm.plugin:load", "egpo_cpu_vllm": "egpo.cpu.vllm_rollout:load"}


@pytest.mark.parametrize("values, environ, fix", [
    ({"engine_kwargs": {"vllm": {"speculative_config": {"method": "eagle"}}}}, {},
     "~actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config"),
    ({"engine_kwargs": {"vllm": {"max_logprobs": -1}}}, {}, "~actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs"),
    ({"mtp": {"enable": True, "enable_rollout": True}}, {}, "actor_rollout_ref.rollout.mtp.enable_rollout=false"),
    ({"pipeline_model_parallel_size": 2}, {}, "use 1"),
    ({"disaggregation": {"enabled": True}}, {}, "actor_rollout_ref.rollout.disaggregation.enabled=false"),
    ({"engine_kwargs": {"vllm": {"enable_batch_sharded_sampling": True}}}, {},
     "~actor_rollout_ref.rollout.engine_kwargs.vllm.enable_batch_sharded_sampling"),
    ({}, {"VLLM_PLUGINS": "lora_resolver"}, "VLLM_PLUGINS=lora_resolver,egpo_rollout_entropy"),
    ({}, {"VLLM_PLUGINS": ""}, "VLLM_PLUGINS=egpo_rollout_entropy"),
])
def test_each_refusal_names_its_fix(values, environ, fix):
    with pytest.raises(UnsupportedVllmSettingError, match="rollout entropy from vLLM cannot be produced") as err:
        refuse_unsupported_settings(rollout(**values), environ=environ)
    assert fix in str(err.value)
