"""Worker side, vLLM's Model Runner V2: the entropy of each sampled position, appended to the sampled-token log probs
exactly as the V1 patch does (:mod:`egpo.rollout.vllm.sampler_patch`), so the same front-end patch takes it off.

V2's ``Sampler.__call__(logits, input_batch)`` samples one step. When some request in the batch needs processing, its
``apply_sampling_params`` copies the logits to fp32, applies logit bias, penalties, bad words and (0.32+) custom
logits processors, then calls ``SamplingStates.apply_temperature``, which divides by the temperature in place: the
entropy is taken at that call's entry, the point of the V1 patch. When no request needs processing (every temperature
0 or 1, no top-k/top-p/min-p, penalties or bias), V2 samples from the raw logits, which it leaves as they are; the
entropy is then taken from ``__call__``'s own logits after sampling. Greedy rows get the raw distribution's entropy.

Two wraps, both on vLLM's classes, both checked by :func:`egpo.rollout.vllm.versions.check_targets` first; nothing
is left on the sampler between steps.
"""

from __future__ import annotations

from egpo.patching import Patch, apply_all
from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.vllm.versions import RUNNER_V2_SAMPLER, RUNNER_V2_STATES
from egpo.rollout.vllm.worker_entropy import attach_entropy, current_options, set_options, step_entropy

STASH = "_egpo_entropy"  # set on the SamplingStates by apply_temperature, taken by Sampler.__call__ within one call


def entropy_apply_temperature(original, self, logits, expanded_idx_mapping, idx_mapping_np):
    temperature = self.temperature.gpu[expanded_idx_mapping] if current_options().temperature_scaled else None
    setattr(self, STASH, step_entropy(logits, temperature))
    return original(self, logits, expanded_idx_mapping, idx_mapping_np)


def entropy_call(original, self, logits, input_batch):
    states = self.sampling_states
    setattr(states, STASH, None)
    try:
        output = original(self, logits, input_batch)
        entropy = getattr(states, STASH)
    finally:
        setattr(states, STASH, None)
    if entropy is None and output.logprobs_tensors is not None:
        # no request needed processing: sampled from these logits, unchanged, with temperatures 0 or 1 only
        entropy = step_entropy(logits, None)
    return attach_entropy(output, entropy)


CALL = Patch(f"{RUNNER_V2_SAMPLER}:Sampler.__call__", entropy_call)
APPLY_TEMPERATURE = Patch(f"{RUNNER_V2_STATES}:SamplingStates.apply_temperature", entropy_apply_temperature)
PATCHES = (CALL, APPLY_TEMPERATURE)


def apply_runner_v2_patch(options: EntropyOptions) -> None:
    """Idempotent; a second call only updates the options. The targets are checked first."""
    from egpo.rollout.vllm.versions import check_targets

    set_options(options)
    if not CALL.applied():
        check_targets()
        apply_all(PATCHES)
