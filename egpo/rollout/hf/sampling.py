"""verl's per-request ``sampling_params`` -> the settings the HF server generates with.

The agent loop sends ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty`` and ``logprobs``
(``verl/experimental/agent_loop/agent_loop.py``), optionally ``max_new_tokens`` / ``max_tokens``; sglang-style
``stop_token_ids``, ``ignore_eos`` and ``n`` are understood too. Anything else is refused by name rather than
silently ignored, so a setting never appears to apply when it does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KNOWN_KEYS = {
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "logprobs",
    "max_new_tokens",
    "max_tokens",
    "stop_token_ids",
    "ignore_eos",
    "n",
}


@dataclass(frozen=True)
class HFSampling:
    """Requests with equal ``HFSampling`` are generated in one batch."""

    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop_token_ids: tuple[int, ...]
    return_log_probs: bool


def resolve_sampling(
    sampling_params: dict[str, Any],
    *,
    prompt_len: int,
    prompt_length: int,
    response_length: int,
    max_model_len: int | None,
    eos_token_ids: tuple[int, ...],
) -> HFSampling:
    """Mirror of verl's sglang server's max-token rule, plus validation of every key."""
    unknown = set(sampling_params) - KNOWN_KEYS
    if unknown:
        raise ValueError(
            f"the hf rollout server does not support sampling parameter(s) {sorted(unknown)}; "
            f"supported: {sorted(KNOWN_KEYS)}"
        )
    if int(sampling_params.get("n", 1)) != 1:
        raise ValueError(
            "the hf rollout server returns one sequence per request (n=1); verl repeats each prompt "
            "actor_rollout_ref.rollout.n times before generation"
        )
    if float(sampling_params.get("repetition_penalty", 1.0)) != 1.0:
        raise ValueError("the hf rollout server does not apply repetition_penalty; leave it at 1.0")

    context = max_model_len if max_model_len else prompt_length + response_length
    room = context - prompt_len
    if room <= 0:
        raise ValueError(f"prompt length {prompt_len} leaves no room in the context of {context} tokens")
    if "max_new_tokens" in sampling_params:
        max_new = int(sampling_params["max_new_tokens"])
    elif "max_tokens" in sampling_params:
        max_new = int(sampling_params["max_tokens"])
    else:
        max_new = min(response_length, prompt_length + response_length - prompt_len)
    max_new = max(1, min(max_new, room))

    stop = tuple(int(t) for t in (sampling_params.get("stop_token_ids") or ()))
    if not sampling_params.get("ignore_eos", False):
        stop = tuple(dict.fromkeys(stop + tuple(eos_token_ids)))
    top_k = sampling_params.get("top_k", -1)
    return HFSampling(
        max_new_tokens=max_new,
        temperature=float(sampling_params.get("temperature", 1.0)),
        top_p=float(sampling_params.get("top_p", 1.0)),
        top_k=-1 if top_k is None else int(top_k),
        stop_token_ids=stop,
        return_log_probs=bool(sampling_params.get("logprobs", False)),
    )
