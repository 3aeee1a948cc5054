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

from egpo.patching import Patch, apply_all
from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.vllm.worker_entropy import attach_entropy, set_options, step_entropy

STASH = "_egpo_entropy"  # set by sample(), taken by forward() within one call


def entropy_sample(original, self, logits, sampling_metadata, *args, **kwargs):
    setattr(self, STASH, step_entropy(logits, sampling_metadata.temperature))
    return original(self, logits, sampling_metadata, *args, **kwargs)


def entropy_forward(original, self, logits, sampling_metadata, *args, **kwargs):
    setattr(self, STASH, None)
    try:
        output = original(self, logits, sampling_metadata, *args, **kwargs)
        entropy = getattr(self, STASH)
    finally:
        setattr(self, STASH, None)
    return attach_entropy(output, entropy)


FORWARD = Patch("vllm.v1.sample.sampler:Sampler.forward", entropy_forward)
SAMPLE = Patch("vllm.v1.sample.sampler:Sampler.sample", entropy_sample)
PATCHES = (FORWARD, SAMPLE)


def apply_sampler_patch(options: EntropyOptions) -> None:
    """Idempotent; a second call only updates the options. The targets are checked first."""
    from egpo.rollout.vllm.versions import check_targets

    set_options(options)
    if not FORWARD.applied():
        check_targets()
        apply_all(PATCHES)
