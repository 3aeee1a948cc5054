"""Per-request sampling that depends only on the seed and the request, never on how requests were batched.

Each row of a batch carries its own 63-bit seed. At response position ``t`` the row draws Gumbel noise ``g[v]``
from a counter-based hash of ``(seed, t, v)`` (the splitmix64 finalizer, vectorized in int64) and takes
``argmax(scores[v] + g[v])`` over the warped scores (temperature, then top-k, then top-p, as transformers applies
them): an exact sample from ``softmax(scores)`` (the Gumbel-max trick). Nothing about the batch (its other rows,
its padding, the order requests arrived in) enters a row's noise.

:class:`SeededSampler` is a transformers ``LogitsProcessor``: it leaves only the sampled token finite, so
``generate(do_sample=False)`` picks it. The raw logits transformers returns (``output_logits``) are untouched.
:func:`request_seed` derives a request's seed from the server's seed and the request itself.
"""

from __future__ import annotations

import hashlib

import torch

_C1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64 constants, as signed int64
_C2 = 0x94D049BB133111EB - (1 << 64)
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
SEED_BITS = 63


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ _shift_right(x, 30)
    x = x * _C1
    x = x ^ _shift_right(x, 27)
    x = x * _C2
    return x ^ _shift_right(x, 31)


def uniform_noise(seeds: torch.Tensor, position: int, vocab: int) -> torch.Tensor:
    """(B, V) float64 uniforms in (0, 1), a pure function of (seed, position, token id)."""
    seeds = seeds.to(torch.int64)
    row = _mix(seeds * _GOLDEN + position)  # one stream per (request, position)
    counter = row[:, None] + torch.arange(1, vocab + 1, dtype=torch.int64, device=seeds.device)[None, :] * _GOLDEN
    bits = _shift_right(_mix(counter), 11)  # 53 random bits
    return (bits.to(torch.float64) + 0.5) / float(1 << 53)


def warp(scores: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper, in that order."""
    scores = scores / temperature
    if top_k is not None and 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        ascending, order = torch.sort(scores, dim=-1)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = False  # keep at least the most likely token
        scores = scores.masked_fill(torch.zeros_like(remove).scatter(-1, order, remove), float("-inf"))
    return scores


class SeededSampler:
    """A transformers logits processor sampling each row from its own seed (see the module docstring)."""

    def __init__(self, seeds: list[int], prompt_width: int, temperature: float, top_k: int, top_p: float):
        if temperature <= 0:
            raise ValueError("SeededSampler samples; temperature <= 0 is greedy decoding")
        self.seeds = torch.tensor(seeds, dtype=torch.int64)
        self.prompt_width = prompt_width
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        position = input_ids.shape[1] - self.prompt_width
        warped = warp(scores.float(), self.temperature, self.top_k, self.top_p)
        noise = uniform_noise(self.seeds.to(scores.device), position, scores.shape[-1])
        gumbel = -torch.log(-torch.log(noise))
        chosen = (warped.double() + gumbel).argmax(dim=-1, keepdim=True)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, chosen, 0.0)


def request_seed(*parts) -> int:
    """A 63-bit seed from the parts' text (server seed, weights version, prompt tokens, row key, occurrence index)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)
