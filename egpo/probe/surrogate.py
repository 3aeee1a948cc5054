"""Scalars whose gradient is the entropy-surrogate direction u = grad H (estimated).

Sequence entropy (score function): grad H = -E[(S - b) grad S], estimated on N sampled responses as
u = -(1/N) sum_j (S_j - b_j) grad S_j with the leave-one-out baseline b_j = mean_{k != j} S_k (unbiased; the
plain mean carries a (1 - 1/N) factor). ``sequence_entropy_surrogate`` returns sum_j sg(c_j) S_j with
c_j = -(S_j - b_j) / N, so one backward of it yields u.

Per-token entropy on fixed contexts (what verl logs as ``actor/entropy``: the token-mean of the entropy of
each position's distribution): only the pathwise term remains, u = grad mean_k H_k, and the surrogate is
that mean itself.
"""

from __future__ import annotations

import torch


def sequence_log_probs(token_log_probs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """S_i = sum_k log pi_ik over valid tokens, ``(N,)``."""
    return (token_log_probs * response_mask).sum(dim=-1)


def leave_one_out_coefficients(seq_log_probs: torch.Tensor) -> torch.Tensor:
    """c_j = -(S_j - mean_{k != j} S_k) / N, detached (needs N >= 2)."""
    s = seq_log_probs.detach()
    n = s.numel()
    if n < 2:
        raise ValueError("the leave-one-out baseline needs at least 2 sequences")
    baseline = (s.sum() - s) / (n - 1)
    return -(s - baseline) / n


def sequence_entropy_surrogate(seq_log_probs: torch.Tensor) -> torch.Tensor:
    """sum_j sg(c_j) S_j: its gradient is the leave-one-out estimate of grad (sequence entropy)."""
    return (leave_one_out_coefficients(seq_log_probs) * seq_log_probs).sum()


def token_entropies(logits: torch.Tensor) -> torch.Tensor:
    """Differentiable entropy of each position's distribution, ``(..., V) -> (...)``, -inf safe."""
    log_p = torch.log_softmax(logits, dim=-1)
    return -torch.special.xlogy(log_p.exp(), log_p.exp()).sum(dim=-1)


def token_entropy_surrogate(logits: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Token-mean entropy over valid positions (verl's ``actor/entropy``); its gradient is u for fixed contexts."""
    h = token_entropies(logits)
    return (h * response_mask).sum() / response_mask.sum().clamp_min(1)
