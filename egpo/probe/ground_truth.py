"""Ground truth for validating the probe on tiny models.

The realised change on fixed contexts is a no-grad re-forward (done inside :mod:`egpo.probe.actor_probe`).
For a small vocabulary the *on-policy* sequence entropy is computable exactly: enumerate every continuation
of a fixed length L (V^L sequences), score them in one batched forward, and take H = -sum p log p in float64.
Its gradient is the exact grad H that the score-function estimate u (:mod:`egpo.probe.surrogate`) estimates.
"""

from __future__ import annotations

import itertools

import torch


def all_continuations(vocab_size: int, length: int) -> torch.Tensor:
    """Every token sequence of ``length`` over ``vocab_size`` tokens, ``(V^L, L)``."""
    if vocab_size ** length > 2_000_000:
        raise ValueError(f"{vocab_size}^{length} continuations is too many to enumerate")
    return torch.tensor(list(itertools.product(range(vocab_size), repeat=length)), dtype=torch.long)


def continuation_log_probs(model, prompt_ids: list[int], continuations: torch.Tensor) -> torch.Tensor:
    """log pi(continuation | prompt) for each row, float64, differentiable (one batched forward)."""
    n, length = continuations.shape
    prompt = torch.tensor(prompt_ids, dtype=torch.long).expand(n, -1)
    ids = torch.cat([prompt, continuations], dim=1)
    logits = model(input_ids=ids).logits[:, len(prompt_ids) - 1 : -1].double()
    token = torch.log_softmax(logits, dim=-1).gather(-1, continuations.unsqueeze(-1)).squeeze(-1)
    return token.sum(dim=-1)


def exact_sequence_entropy(model, prompt_ids: list[int], length: int) -> torch.Tensor:
    """H = -sum_s p(s) log p(s) over all continuations of ``length`` (differentiable, float64).

    Fixed-length sequences: the distribution is the model's over L tokens, with no stop token ending a
    sequence early (the tiny validation setting, not a chat rollout).
    """
    vocab = model.config.vocab_size
    log_p = continuation_log_probs(model, prompt_ids, all_continuations(vocab, length))
    return -(log_p.exp() * log_p).sum()
