"""sglang settings refused per version, without sglang: the observer versions (0.5.20+) also refuse what would act on
the sampled distribution after egpo's SamplingObserver takes the entropy, or what runs no observer."""

from types import SimpleNamespace

import pytest

from egpo.rollout.sglang import versions
from egpo.rollout.sglang.limits import UnsupportedRolloutSettingError, refuse_unsupported_settings

BASE = dict(data_parallel_size=1, pipeline_model_parallel_size=1,
            mtp=SimpleNamespace(enable=False, enable_rollout=False))
AFTER_OBSERVER = [
    ({"enable_custom_logit_processor": True}, "custom logit processors apply after egpo's SamplingObserver"),
    ({"preferred_sampling_params": '{"logit_bias": {"5": -100}}'}, "default grammars and logit_bias apply after"),
    ({"preferred_sampling_params": '{"json_schema": "{}"}'}, "preferred_sampling_params"),
    ({"dllm_algorithm": "LowConfidence"}, "runs no SamplingObserver for diffusion language models"),
]


def rollout(**sglang):
    return SimpleNamespace(**BASE, engine_kwargs={"sglang": sglang})


@pytest.mark.parametrize("version", ["0.5.20", "0.5.21", "0.5.23"])
@pytest.mark.parametrize("kwargs, message", AFTER_OBSERVER)
def test_observer_versions_refuse_what_acts_after_the_observer(monkeypatch, version, kwargs, message):
    monkeypatch.setattr(versions, "installed_sglang", lambda: version)
    refuse_unsupported_settings(rollout())
    refuse_unsupported_settings(rollout(preferred_sampling_params='{"temperature": 0.6}'))
    with pytest.raises(UnsupportedRolloutSettingError, match=message) as err:
        refuse_unsupported_settings(rollout(**kwargs))
    [key] = kwargs
    assert f"~actor_rollout_ref.rollout.engine_kwargs.sglang.{key}" in str(err.value)


@pytest.mark.parametrize("version", ["0.5.6.post2", "0.5.12"])
@pytest.mark.parametrize("kwargs, message", AFTER_OBSERVER[:2])
def test_patched_versions_take_the_entropy_after_grammar_and_bias(monkeypatch, version, kwargs, message):
    """0.5.6.post2's and 0.5.12's patch sees the logits the sampler draws from, after grammar and bias."""
    monkeypatch.setattr(versions, "installed_sglang", lambda: version)
    refuse_unsupported_settings(rollout(**kwargs))


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_speculative_decoding_is_refused_on_the_observer_versions_too(monkeypatch, version):
    monkeypatch.setattr(versions, "installed_sglang", lambda: version)
    with pytest.raises(UnsupportedRolloutSettingError, match="speculative_algorithm=EAGLE"):
        refuse_unsupported_settings(rollout(speculative_algorithm="EAGLE"))
