"""What egpo's two vLLM worker patches share (V1's sampler, :mod:`egpo.rollout.vllm.sampler_patch`; Model Runner
V2's, :mod:`egpo.rollout.vllm.runner_v2_patch`): the entropy options of this process, the entropy of one step's
logits, and the column it rides back to the front end in.

The options come from egpo's server through the environment (:mod:`egpo.rollout.engine_options`); the plugin sets
them once per process. On an accelerator the compiled kernel runs, warmed at the sampler's first call in the worker
(vLLM's profile run, before any request).
"""

from __future__ import annotations

import torch

from egpo.rollout.entropy import EntropyOptions, token_entropy, warm_compiled_kernel
from egpo.rollout.vllm.entropy_column import ENTROPY_COLUMN_ID

_worker: dict = {"options": EntropyOptions(), "warmed": False}


def set_options(options: EntropyOptions) -> None:
    _worker["options"] = options


def current_options() -> EntropyOptions:
    return _worker["options"]


def uses_compiled_kernel(logits) -> bool:
    """The compiled kernel runs on an accelerator; the CPU runs the eager one."""
    return logits.is_cuda


def warm_once(logits, options: EntropyOptions) -> None:
    """At the sampler's first call in this worker, the compiled kernel for every shape vLLM will use: 1 row (torch
    specializes it: vLLM's own warm-up never samples one row, so a worker's first one-request step would compile
    inside an engine step) and several, raw and, if asked, scaled."""
    if _worker["warmed"]:
        return
    _worker["warmed"] = True
    warm_compiled_kernel(options.kernel_width(logits.shape[-1]), logits.device,
                         temperature_scaled=options.temperature_scaled)


def step_entropy(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """The entropy of each row of one sampling step's ``logits`` with this process's options; ``temperature`` (one
    per row, 0 for greedy rows) is used only with ``temperature_scaled``."""
    options = _worker["options"]
    compiled = uses_compiled_kernel(logits)
    if compiled:
        warm_once(logits, options)
    return token_entropy(logits, top_k=options.top_k, temperature=temperature if options.temperature_scaled else None,
                         compiled=compiled)


def attach_entropy(output, entropy: torch.Tensor | None):
    """``output`` (a sampler output) with its log probs carrying ``entropy`` as one more column, where log probs were
    asked for and there is one value per row; otherwise unchanged."""
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
