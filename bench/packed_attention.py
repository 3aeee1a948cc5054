"""What the preflight's other attention costs: PyTorch's ``sdpa`` over a packed micro-batch against attention within
each sequence, as ratios measured in one run.

    python bench/packed_attention.py [--tokens 4096] [--heads 8] [--head-dim 128] [--rounds 5]

The qwen3 recipes pack sequences (``use_remove_padding=true``) into micro-batches of up to
``ppo_max_token_len_per_gpu`` tokens (34,816 on qwen3_4b, two 17,408-token sequences at full length). flash-attn's
variable-length kernel attends within each sequence. Without flash-attn (the preflight's ``attn_implementation=sdpa``
fix), transformers hands ``torch.nn.functional.scaled_dot_product_attention`` the packed sequence with a
block-diagonal causal mask over all of it: the work and the mask grow with the square of the micro-batch's tokens,
not of each sequence's. This times both on the same tensors (interleaved rounds, the median), ``k`` sequences of
``tokens / k`` tokens each, for a few ``k``, and states the mask's size at the recipe's packed length. A CPU's ratio
is the shape of the cost (the squares), not a GPU's time: sdpa's flash backend refuses an explicit mask, so on a GPU
the masked call also falls back to a slower kernel, which this does not show.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

RECIPE_TOKENS = 34_816  # qwen3_4b's ppo_max_token_len_per_gpu


def block_causal_mask(lengths: list[int]) -> torch.Tensor:
    """True where a packed position may attend: earlier or same positions of its own sequence."""
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    total = int(seq.numel())
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    return causal & (seq[:, None] == seq[None, :])


def packed(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def per_sequence(q, k, v, lengths):
    outs, start = [], 0
    for length in lengths:  # flash-attn's varlen kernel: each sequence alone (a bench, not a hot path)
        end = start + length
        outs.append(F.scaled_dot_product_attention(q[..., start:end, :], k[..., start:end, :], v[..., start:end, :],
                                                   is_causal=True))
        start = end
    return torch.cat(outs, dim=-2)


def timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads; {args.tokens} packed tokens, {args.heads} heads x {args.head_dim}, fp32")
    print("| sequences packed | sdpa, block mask (s) | per sequence (s) | ratio | mask (MB) |")
    print("|---|---|---|---|---|")
    for count in (1, 2, 4, 8):
        lengths = [args.tokens // count] * count
        total = sum(lengths)
        q, k, v = (torch.randn(1, args.heads, total, args.head_dim) for _ in range(3))
        mask = block_causal_mask(lengths)
        torch.testing.assert_close(packed(q, k, v, mask), per_sequence(q, k, v, lengths), rtol=1e-4, atol=1e-5)
        a, b = [], []
        for _ in range(args.rounds):  # interleaved: machine noise hits both alike
            a.append(timed(packed, q, k, v, mask))
            b.append(timed(per_sequence, q, k, v, lengths))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"| {count} | {ma:.3f} | {mb:.3f} | {ma / mb:.2f} | {mask.numel() / 1e6:.1f} |")
    print(f"the block mask at the recipe's {RECIPE_TOKENS:,} packed tokens: {RECIPE_TOKENS ** 2 / 1e9:.2f} GB (bool), "
          "per layer's call")


if __name__ == "__main__":
    main()
