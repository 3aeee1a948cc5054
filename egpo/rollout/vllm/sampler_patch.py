"""Worker side, vLLM's V1 model runner: the entropy of each sampled position, appended to vLLM's sampled-token log
probs (Model Runner V2 has a sampler of its own: :mod:`egpo.rollout.vllm.runner_v2_patch`).

``Sampler.forward`` converts the logits to fp32 and applies allowed ids, bad words, logit bias, min-tokens,
custom processors and penalties; then ``Sampler.sample`` divides them by the temperature in place and draws. The
entropy is taken at the entry of ``Sampler.sample`` (the point egpo's sglang patch uses), with the options of
:class:`egpo.rollout.entropy.EntropyOptions`; greedy rows (temperature 0) get the raw distribution's entropy.

``Sampler.forward`` then appends one column to ``SamplerOutput.logprobs_tensors``: egpo's mark in the token-id place
(:mod:`egpo.rollout.vllm.entropy_column`) and the entropy in the log-prob place. vLLM's own path carries it
(device-to-host copy, per-request row slicing after stop truncation, the engine-core message);
:mod:`egpo.rollout.vllm.frontend_patch` takes it off again. Log probs must be requested (``logprobs >= 0``) for the
column to exist: egpo's server asks for them. Nothing is left on the sampler between steps. The methods are patched
on vLLM's class (instances built from an earlier import see them too).
"""

from __future__ import annotations

from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.vllm.versions import patch_function
from egpo.rollout.vllm.worker_entropy import attach_entropy, set_options, step_entropy

STASH = "_egpo_entropy"  # set by sample(), taken by forward() within one call

_state: dict = {"forward": None, "sample": None}


@patch_function
def entropy_sample(self, logits, sampling_metadata, *args, **kwargs):
    setattr(self, STASH, step_entropy(logits, sampling_metadata.temperature))
    return _state["sample"](self, logits, sampling_metadata, *args, **kwargs)


@patch_function
def entropy_forward(self, logits, sampling_metadata, *args, **kwargs):
    setattr(self, STASH, None)
    try:
        output = _state["forward"](self, logits, sampling_metadata, *args, **kwargs)
        entropy = getattr(self, STASH)
    finally:
        setattr(self, STASH, None)
    return attach_entropy(output, entropy)


def apply_sampler_patch(options: EntropyOptions) -> None:
    """Idempotent; a second call only updates the options. The targets are checked first."""
    from egpo.rollout.vllm.versions import check_targets

    set_options(options)
    from vllm.v1.sample.sampler import Sampler

    if Sampler.forward is entropy_forward:
        return
    check_targets()
    _state["forward"], _state["sample"] = Sampler.forward, Sampler.sample
    Sampler.forward, Sampler.sample = entropy_forward, entropy_sample


def remove_sampler_patch() -> None:
    from vllm.v1.sample.sampler import Sampler

    if Sampler.forward is entropy_forward:
        Sampler.forward, Sampler.sample = _state["forward"], _state["sample"]
        _state["forward"] = _state["sample"] = None
