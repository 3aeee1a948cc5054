"""Worker side: the entropy of each sampled position, appended to vLLM's sampled-token log probs.

``Sampler.forward`` converts the logits to fp32 and applies allowed ids, bad words, logit bias, min-tokens,
custom processors and penalties; then ``Sampler.sample`` divides them by the temperature in place and draws. The
entropy is taken at the entry of ``Sampler.sample`` (the point egpo's sglang patch uses), with the options of
:class:`egpo.rollout.entropy.EntropyOptions`; greedy rows (temperature 0) get the raw distribution's entropy.

``Sampler.forward`` then appends one column to ``SamplerOutput.logprobs_tensors``: egpo's mark in the token-id place
(:mod:`egpo.rollout.vllm.entropy_column`) and the entropy in the log-prob place. vLLM's own path carries it (device-to-host copy, per-request row slicing after stop
truncation, the engine-core message); :mod:`egpo.rollout.vllm.frontend_patch` takes it off again. Log probs must be
requested (``logprobs >= 0``) for the column to exist: egpo's server asks for them. Nothing is left on the sampler
between steps. The methods are patched on vLLM's class (instances built from an earlier import see them too).
"""

from __future__ import annotations

import torch

from egpo.rollout.entropy import EntropyOptions, token_entropy, warm_compiled_kernel
from egpo.rollout.vllm.entropy_column import ENTROPY_COLUMN_ID
from egpo.rollout.vllm.versions import patch_function

STASH = "_egpo_entropy"  # set by sample(), taken by forward() within one call

_state: dict = {"forward": None, "sample": None, "options": EntropyOptions(), "warmed": False}


def uses_compiled_kernel(logits) -> bool:
    """The compiled kernel runs on an accelerator; the CPU runs the eager one."""
    return logits.is_cuda


def warm_once(logits, options: EntropyOptions) -> None:
    """At the sampler's first call in this worker (vLLM's profile run, before any request), the compiled kernel for
    every shape vLLM will use: 1 row (torch specializes it: vLLM's own warm-up never samples one row, so a worker's
    first one-request step would compile inside an engine step) and several, raw and, if asked, scaled."""
    if _state["warmed"]:
        return
    _state["warmed"] = True
    warm_compiled_kernel(options.kernel_width(logits.shape[-1]), logits.device,
                         temperature_scaled=options.temperature_scaled)


@patch_function
def entropy_sample(self, logits, sampling_metadata, *args, **kwargs):
    options = _state["options"]
    temperature = sampling_metadata.temperature if options.temperature_scaled else None
    compiled = uses_compiled_kernel(logits)
    if compiled:
        warm_once(logits, options)
    entropy = token_entropy(logits, top_k=options.top_k, temperature=temperature, compiled=compiled)
    setattr(self, STASH, entropy)
    return _state["sample"](self, logits, sampling_metadata, *args, **kwargs)


@patch_function
def entropy_forward(self, logits, sampling_metadata, *args, **kwargs):
    setattr(self, STASH, None)
    try:
        output = _state["forward"](self, logits, sampling_metadata, *args, **kwargs)
        entropy = getattr(self, STASH)
    finally:
        setattr(self, STASH, None)
    tensors = output.logprobs_tensors
    if entropy is not None and tensors is not None and tensors.logprob_token_ids.dim() == 2 \
            and tensors.logprob_token_ids.shape[0] == entropy.shape[0]:
        output.logprobs_tensors = with_entropy_column(tensors, entropy)
    return output


def with_entropy_column(tensors, entropy: torch.Tensor):
    """``tensors`` with one more column: egpo's mark as its token id and ``entropy`` as its value."""
    ids, logprobs = tensors.logprob_token_ids, tensors.logprobs
    return tensors._replace(
        logprob_token_ids=torch.cat((ids, torch.full_like(ids[:, :1], ENTROPY_COLUMN_ID)), dim=1),
        logprobs=torch.cat((logprobs, entropy.to(logprobs.dtype).unsqueeze(1)), dim=1),
    )


def apply_sampler_patch(options: EntropyOptions) -> None:
    """Idempotent; a second call only updates the options. The targets are checked first."""
    from egpo.rollout.vllm.versions import check_targets

    _state["options"] = options
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
