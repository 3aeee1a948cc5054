"""What ``egpo.generate`` adds to the rollout, and what ``egpo.analyze`` costs per million tokens.

    python bench/generation.py [--rows 64] [--response-length 256] [--analysis-tokens 1000000]

1. The rollout alone: egpo's HF rollout (``generate_batch``, the demo model's architecture, CPU) sampling a chunk of
   ``--rows`` responses; then what egpo.generate does with the chunk: the rows (``rows_table``: masks, ragged
   columns, decoding) and the part file (``write_part``: parquet, fsync, rename). Reported as a ratio to the
   rollout's time, and per million response tokens at a GPU-sized chunk (512 rows x 4,096 tokens, random tokens).
2. The analysis: two runs of ``--analysis-tokens`` tokens each on the same responses (a gamma-shaped entropy, as
   reasoning models' is), ``egpo.analyze`` with 200 bootstrap resamples, the plots and the page: seconds per million
   tokens.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


class ByteTokenizer:
    def batch_decode(self, rows, skip_special_tokens=False):
        return ["".join(chr(32 + t % 90) for t in row) for row in rows]


def chunk_tensors(rows: int, prompt: int, response: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(response // 4, response + 1, (rows,), generator=g)
    response_mask = (torch.arange(response)[None] < lengths[:, None]).long()
    return {
        "index": np.repeat(np.arange(rows // 8 + 1), 8)[:rows],
        "prompts": torch.randint(0, vocab, (rows, prompt), generator=g),
        "prompt_mask": torch.ones(rows, prompt, dtype=torch.long),
        "responses": torch.randint(0, vocab, (rows, response), generator=g) * response_mask,
        "response_mask": response_mask,
        "entropy": torch.rand(rows, response, generator=g) * response_mask,
        "log_prob": -torch.rand(rows, response, generator=g) * response_mask,
        "scores": torch.rand(rows, generator=g).tolist(),
    }


def write_chunk(out: Path, k: int, tensors: dict, tokenizer) -> float:
    from egpo.runs.generation_rows import rows_table
    from egpo.runs.generation_store import SampleStore

    store = SampleStore(out)
    store.samples.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    store.write_part(k, rows_table(**tensors, tokenizer=tokenizer))
    return time.perf_counter() - started


def rollout_and_rows(rows: int, response_length: int) -> None:
    from egpo.demo.build import build_model
    from egpo.demo.tokenizer import build_tokenizer
    from egpo.rollout.hf.generate import generate_batch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model = AutoModelForCausalLM.from_pretrained(build_model(Path(tmp) / "model", initializer_range=0.5),
                                                     dtype=torch.float32, attn_implementation="eager").eval()
        tokenizer = build_tokenizer()
        vocab = model.config.vocab_size
        prompts = [torch.randint(5, vocab, (24,)).tolist() for _ in range(rows)]
        started = time.perf_counter()
        out = generate_batch(model, prompts, max_new_tokens=response_length, stop_token_ids=[],
                             pad_token_id=0, row_seeds=list(range(rows)))
        rollout = time.perf_counter() - started
        lengths = [len(o.token_ids) for o in out]
        width = max(lengths)
        from egpo.runs.generation_rows import padded

        responses, mask = padded([t for o in out for t in o.token_ids], lengths, width, 0, left=False)
        entropy = torch.zeros(mask.shape)
        entropy[mask.bool()] = torch.tensor([h for o in out for h in o.entropy])
        log_prob = torch.zeros_like(entropy)
        log_prob[mask.bool()] = torch.tensor([p for o in out for p in o.log_probs])
        prompt_ids, prompt_mask = padded([t for p in prompts for t in p], [24] * rows, 24, 0, left=True)
        tensors = {"index": np.repeat(np.arange(rows // 8 + 1), 8)[:rows], "prompts": prompt_ids,
                   "prompt_mask": prompt_mask, "responses": responses, "response_mask": mask, "entropy": entropy,
                   "log_prob": log_prob, "scores": [0.0] * rows}
        written = min(write_chunk(Path(tmp) / "gen", k, tensors, tokenizer) for k in range(3))
        tokens = sum(lengths)
        print(f"demo model, CPU: the rollout sampled {rows} x {response_length} tokens ({tokens:,}) in {rollout:.2f} s; "
              f"rows + part file {written * 1000:.1f} ms = {written / rollout:.4f}x the rollout's time")

    with tempfile.TemporaryDirectory() as tmp:
        big = chunk_tensors(512, 1024, 4096, 151_936)
        tokens = int(big["response_mask"].sum())
        seconds = min(write_chunk(Path(tmp), k, big, ByteTokenizer()) for k in range(3))
        size = (Path(tmp) / "samples" / "part-00000.parquet").stat().st_size
        print(f"GPU-sized chunk (512 rows x 4,096 response tokens, {tokens:,} tokens): rows + part file "
              f"{seconds:.2f} s = {seconds / tokens * 1e6:.2f} s per million response tokens; part {size / 2**20:.0f} MiB")


def analysis(tokens: int) -> None:
    from egpo.analyze import analyze

    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from generation_rows import write_run

    rng = np.random.default_rng(0)
    per_row = 400
    n_rows = tokens // per_row
    rows = []
    for i in range(n_rows):
        ids = rng.integers(5, 30_000, per_row)
        ids[int(rng.integers(per_row // 2, per_row))] = 4  # a thought closes in every response
        rows.append({"index": i // 8, "sample": i % 8, "prompt_ids": [1, 2, 3], "response_ids": ids.tolist(),
                     "entropy": rng.gamma(0.3, 1.0, per_row).astype(np.float32).tolist(),
                     "score": float(rng.integers(0, 2))})
    with tempfile.TemporaryDirectory() as tmp:
        a = write_run(Path(tmp) / "a", rows, responses_id="same", parts=8)
        b = write_run(Path(tmp) / "b", [{**r, "entropy": [h * 1.1 for h in r["entropy"]]} for r in rows],
                      responses_id="same", parts=8)
        started = time.perf_counter()
        analyze([a, b], Path(tmp) / "report", resamples=200)
        seconds = time.perf_counter() - started
    total = 2 * n_rows * per_row
    print(f"analysis of 2 runs x {n_rows * per_row:,} tokens on the same responses (200 resamples, plots, page): "
          f"{seconds:.1f} s = {seconds / total * 1e6:.1f} s per million tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--response-length", type=int, default=256)
    parser.add_argument("--analysis-tokens", type=int, default=1_000_000)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    rollout_and_rows(args.rows, args.response_length)
    analysis(args.analysis_tokens)


if __name__ == "__main__":
    main()
