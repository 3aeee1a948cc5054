"""The rollout entropy kernel vs one read of the logits and vs softmax(x / T), as ratios in one run.

    python bench/entropy_kernel.py [--rounds 7] [--threads 1] [--device cpu]

Shapes: B=32 bf16 (cache-resident) and B=256 fp32 (memory-bound), V=151936 (Qwen3), 200 -inf per row.
Rounds interleave all candidates; medians with min-max. A correctness gate (float64 reference, -inf rows,
one-hot = 0, +40 offset, bf16) runs first; the compiled kernel's graph count over a sweep of batch sizes
shows it does not recompile per batch size. Memory: the eager path works in row blocks of at most
`DEFAULT_BLOCK_BYTES` of fp32 temporaries by construction (reported), the compiled path is one fused pass;
"fallback blocks" is the eager path as it runs on an accelerator once compiling failed (`FALLBACK_BLOCK_BYTES`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from egpo.rollout.entropy import DEFAULT_BLOCK_BYTES, FALLBACK_BLOCK_BYTES, token_entropy

V = 151936


def logits(batch, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(batch, V, generator=g) * 4
    x[:, torch.randperm(V, generator=g)[:200]] = float("-inf")
    return x.to(device=device, dtype=dtype)


def gate(device) -> None:
    x = logits(8, torch.float32, device)
    x[1] = float("-inf")
    x[1, 3] = 0.0
    x[2] += 40.0
    p = torch.softmax(x.double(), -1)
    ref = -torch.special.xlogy(p, p).sum(-1)
    for compiled in (False, True):
        for xx, tol in ((x, 1e-5), (x.bfloat16(), 1e-2)):
            h = token_entropy(xx, compiled=compiled).double()
            r = ref if xx.dtype == torch.float32 else (lambda q: -torch.special.xlogy(q, q).sum(-1))(
                torch.softmax(xx.double(), -1))
            assert torch.allclose(h, r, rtol=1e-5, atol=1e-5), (compiled, xx.dtype, (h - r).abs().max())
            assert h[1].item() == 0.0
    print("correctness gate: ok (fp32/bf16, eager/compiled, -inf rows, one-hot = 0, +40 offset)")


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def bench(batch, dtype, device, rounds):
    x = logits(batch, dtype, device)
    t = torch.full((batch,), 0.7, device=device)
    cands = {
        "one read (x.sum)": lambda: x.sum(-1),
        "softmax(x/T)": lambda: torch.softmax(x / t[:, None], -1),
        "naive -(p*logp)": lambda: (lambda lp: -(lp.exp() * lp.clamp_min(-1e30)).sum(-1))(torch.log_softmax(x.float(), -1)),
        "egpo eager": lambda: token_entropy(x),
        "egpo eager, fallback blocks": lambda: token_entropy(x, max_block_bytes=FALLBACK_BLOCK_BYTES),
        "egpo compiled": lambda: token_entropy(x, compiled=True),
        "egpo compiled, scaled": lambda: token_entropy(x, temperature=t, compiled=True),
        "egpo top-k 20": lambda: token_entropy(x, top_k=20),
    }
    for fn in cands.values():
        fn(), fn()
    times = {k: [] for k in cands}
    for _ in range(rounds):
        for k, fn in cands.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    read, soft = times["one read (x.sum)"], times["softmax(x/T)"]
    print(f"\nB={batch} {str(dtype).replace('torch.', '')} V={V}")
    print(f"{'':24s} {'median ms':>10s} {'x read':>8s} {'x softmax':>10s}  (x read min-max)")
    for k, ts in times.items():
        rr = [a / b for a, b in zip(ts, read)]
        rs = [a / b for a, b in zip(ts, soft)]
        print(f"{k:24s} {statistics.median(ts) * 1e3:10.2f} {statistics.median(rr):8.2f} "
              f"{statistics.median(rs):10.2f}  ({min(rr):.2f}-{max(rr):.2f})")


def graph_count(device) -> int:
    import torch._dynamo

    torch._dynamo.reset()
    from egpo.rollout import entropy

    entropy._compiled_block = None
    for b in (1, 3, 17, 64, 100, 255, 256, 511):
        token_entropy(logits(b, torch.float32, device), compiled=True)
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads; "
          f"eager block bound {DEFAULT_BLOCK_BYTES / 2**20:.0f} MiB of fp32 temporaries")
    gate(args.device)
    print(f"compiled graphs over 8 batch sizes (1..511), fp32: {graph_count(args.device)}")
    bench(32, torch.bfloat16, args.device, args.rounds)
    bench(256, torch.float32, args.device, args.rounds)


if __name__ == "__main__":
    main()
