"""The patched-vs-plain sampler table both sampler benches print: interleaved rounds, medians, ratios."""

from __future__ import annotations

import argparse
import statistics

import torch


def patch_bench_arguments(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--rounds", type=int, default=15)
    return parser.parse_args()


def print_patch_table(timed, batches: list[int], vocab: int, rounds: int, device) -> None:
    """``timed(logits, batch, patched) -> seconds``; one markdown row per batch size."""
    print("| batch | sampler (ms) | sampler + entropy patch (ms) | ratio |")
    print("|---|---|---|---|")
    for bs in batches:
        x = torch.randn(bs, vocab, device=device) * 3
        for patched in (False, True):  # warm-up (and compile, on CUDA)
            timed(x, bs, patched)
        plain, patched = [], []
        for _ in range(rounds):
            plain.append(timed(x, bs, False))
            patched.append(timed(x, bs, True))
        p, q = statistics.median(plain) * 1e3, statistics.median(patched) * 1e3
        print(f"| {bs} | {p:.2f} | {q:.2f} | {q / p:.2f}x |")
