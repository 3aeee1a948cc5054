"""EGPO vs verl's GRPO estimator on the same batch, as a ratio measured in one run.

    python bench/advantage.py [--bs 4096] [--length 8192] [--group 8] [--rounds 5]

Both estimators see identical tensors; rounds interleave the two so machine noise hits both alike. Prints
the median time of each, the ratio with its spread over rounds, and the EGPO-only stages.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from egpo.advantage import compute_cot_mask, compute_egpo_outcome_advantage

START, END = 151667, 151668


def make_batch(bs: int, length: int, group: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 4, length + 1, (bs,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()  # verl's response_mask dtype
    responses = torch.randint(0, 150000, (bs, length), generator=g)
    rows = torch.arange(bs)
    responses[:, 0] = START
    responses[rows, lengths // 2] = END  # thinking for half the response, as in a real CoT
    rewards = torch.zeros(bs, length)
    rewards[rows, lengths - 1] = torch.randint(0, 2, (bs,), generator=g).float()
    entropy = torch.rand(bs, length, generator=g) * 2
    index = np.array([f"prompt-{i // group}" for i in range(bs)], dtype=object)
    return rewards, mask, index, entropy, responses


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bs", type=int, default=4096)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    rewards, mask, index, entropy, responses = make_batch(args.bs, args.length, args.group)
    grpo = lambda: compute_grpo_outcome_advantage(rewards, mask, index)  # noqa: E731
    egpo = lambda: compute_egpo_outcome_advantage(rewards, mask, index, entropy, responses)  # noqa: E731
    cot = lambda: compute_cot_mask(responses, mask, START, END)  # noqa: E731
    for fn in (grpo, egpo, cot):  # warm the allocator
        fn()
    t_grpo, t_egpo, t_cot, ratios = [], [], [], []
    for _ in range(args.rounds):
        a, b, c = timed(grpo), timed(egpo), timed(cot)
        t_grpo.append(a)
        t_egpo.append(b)
        t_cot.append(c)
        ratios.append(b / a)
    med = statistics.median
    print(f"machine: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"batch: {args.bs} responses x {args.length} tokens, groups of {args.group}, {args.rounds} rounds")
    print(f"verl GRPO            median {med(t_grpo) * 1e3:8.1f} ms")
    print(f"egpo EGPO            median {med(t_egpo) * 1e3:8.1f} ms")
    print(f"  of which CoT mask  median {med(t_cot) * 1e3:8.1f} ms")
    print(f"ratio EGPO / GRPO    median {med(ratios):.2f}x  (min {min(ratios):.2f}, max {max(ratios):.2f})")


if __name__ == "__main__":
    main()
