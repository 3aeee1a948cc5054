"""``Sampler.forward``: per-token entropy of the logits the sampler is about to sample from.

The original overwrites ``logits_output.next_token_logits`` in place (``div_`` by the temperature, then
``logits[:] = softmax``), so the entropy is computed before it runs, from the logits as they enter the
sampler (after penalties, grammar masks and logit bias; ``-inf`` entries are safe). It is stored as
``logits_output.next_token_entropy`` (one float32 per row, on the logits' device, no sync), for the
scheduler-side patches to carry to the CPU and into each request. Greedy rows get entropy too.

The method is patched on the original class (``model_runner`` imports ``Sampler`` at module level, so a class
swap would miss instances built from the earlier import).
"""

from __future__ import annotations

from egpo.patching import Patch
from egpo.rollout.entropy import EntropyOptions, token_entropy, warm_compiled_kernel
from egpo.rollout.sglang.versions import check_parameters

ENTROPY_ATTR = "next_token_entropy"
FORWARD_PARAMS = ("logits_output", "sampling_info", "return_logprob", "top_logprobs_nums", "token_ids_logprobs", "positions")

_options: dict = {"current": EntropyOptions()}  # this process's options (set by apply_sampler_patch)


def entropy_sampler_forward(original, self, logits_output, sampling_info, *args, **kwargs):
    options = _options["current"]
    temperature = sampling_info.temperatures if options.temperature_scaled else None
    logits = logits_output.next_token_logits
    # fused (torch.compile, eager fallback) on the GPU; eager elsewhere
    entropy = token_entropy(logits, top_k=options.top_k, temperature=temperature, compiled=logits.is_cuda)
    setattr(logits_output, ENTROPY_ATTR, entropy)
    return original(self, logits_output, sampling_info, *args, **kwargs)


SAMPLER_FORWARD = Patch("sglang.srt.layers.sampler:Sampler.forward", entropy_sampler_forward)


def kernel_width(server_args, options: EntropyOptions) -> int:
    """The logits' width at the sampler: the model's ``vocab_size`` (sglang slices its logits to it), or top_k."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(server_args.model_path, trust_remote_code=server_args.trust_remote_code)
    return options.kernel_width(int(config.get_text_config().vocab_size))


def warm_sampler_kernel(server_args, gpu_id: int, options: EntropyOptions, device=None) -> dict | None:
    """In the scheduler process, before sglang builds its scheduler: the compiled kernel (used on CUDA) is compiled
    for the model's width, so the first sampled batch does not wait for it. ``device``: where it will run (default
    this scheduler's GPU; nothing to warm without one, the CPU runs the eager kernel)."""
    import torch

    if device is None:
        if not torch.cuda.is_available():
            return None
        device = torch.device("cuda", gpu_id)
    return warm_compiled_kernel(kernel_width(server_args, options), device, temperature_scaled=options.temperature_scaled)


def apply_sampler_patch(options: EntropyOptions) -> None:
    """Idempotent; a second call only updates the options."""
    _options["current"] = options
    if not SAMPLER_FORWARD.applied():
        check_parameters(SAMPLER_FORWARD.original(), FORWARD_PARAMS, SAMPLER_FORWARD.dotted)
        SAMPLER_FORWARD.apply()
