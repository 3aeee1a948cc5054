"""The rollout entropy's share of a real sglang decode step (the installed sglang's Engine: 0.5.6.post2 or 0.5.12 with
egpo's patches, 0.5.20+ with egpo's SamplingObserver).

    python bench/engine_decode.py [--models demo qwen3-0.6b] [--batches 1 32 256] [--new-tokens 8]

For each model an sglang ``Engine`` is started with egpo's patches installed the way the rollout server installs
them. Inside the scheduler process, a bench-only entry times (a) egpo's entropy computation (in the patched
``Sampler.forward``, or the observer's ``before_grammar``), (a') on observer versions, the observer's ``consume``
(each committed token's value into its request) and (b) the whole decode step (``run_batch`` + ``process_batch_result``, overlap scheduling
off so both are synchronous), per decode batch size. The share is (a) / (b), measured on the same steps of one
run. Models: the demo Qwen3 (V=80) and a random-weight model with Qwen3-0.6B's shape (V=151936, 28 layers,
hidden 1024), fp32, built locally. Needs sglang's CPU install (docs/cpu.md, "sglang on a CPU").
"""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from pathlib import Path

from decode_models import build_bench_model, decode_bench_arguments

# egpo's process entries first: they install the CPU stand-ins before anything imports sglang
from egpo.rollout.sglang.process_entries import (
    install_process_entries,
    remove_process_entries,
    run_detokenizer_process_with_standins,
    scheduler_entry,
    set_engine_entries,
)

TIMINGS_KEY = "egpo_bench_decode_timings"

def run_scheduler_with_timers(*args, **kwargs):
    """Bench-only scheduler entry (runs in the spawned scheduler process): egpo's, plus timers."""
    from sglang.srt.managers.scheduler import Scheduler

    from egpo.rollout.sglang import observer, sampler_patch
    from egpo.rollout.sglang.versions import sglang_targets

    timings = defaultdict(lambda: [0.0, 0.0, 0, 0.0])  # decode batch size -> [entropy s, step s, steps, consume s]
    current = {"entropy": 0.0, "consume": 0.0}
    entropy_module = observer if sglang_targets().entropy_via_observer else sampler_patch
    token_entropy = entropy_module.token_entropy
    consume = observer.EntropyHostOutput.consume

    def timed_entropy(*a, **kw):
        start = time.perf_counter()
        out = token_entropy(*a, **kw)
        current["entropy"] += time.perf_counter() - start
        return out

    def timed_consume(self, *a, **kw):
        start = time.perf_counter()
        out = consume(self, *a, **kw)
        current["consume"] += time.perf_counter() - start
        return out

    run_batch, process_result = Scheduler.run_batch, Scheduler.process_batch_result

    def timed_run_batch(self, batch, *args, **kwargs):
        current["entropy"] = current["consume"] = 0.0
        current["start"] = time.perf_counter()
        return run_batch(self, batch, *args, **kwargs)

    def timed_process_result(self, batch, result):
        out = process_result(self, batch, result)
        if batch.forward_mode.is_decode():
            row = timings[len(batch.reqs)]
            row[0] += current["entropy"]
            row[1] += time.perf_counter() - current["start"]
            row[2] += 1
            row[3] += current["consume"]
        return out

    get_internal_state = Scheduler.get_internal_state

    def internal_state(self, recv_req):
        reply = get_internal_state(self, recv_req)
        reply.internal_state[TIMINGS_KEY] = {str(k): list(v) for k, v in timings.items()}
        return reply

    entropy_module.token_entropy = timed_entropy
    observer.EntropyHostOutput.consume = timed_consume
    Scheduler.run_batch = timed_run_batch
    Scheduler.process_batch_result = timed_process_result
    Scheduler.get_internal_state = internal_state
    return scheduler_entry()(*args, **kwargs)  # egpo's entry for this sglang (0.5.12: its plugin patches)


def measure(model_dir: Path, batches: list[int], new_tokens: int) -> dict[int, tuple[float, float, int]]:
    import sglang

    from egpo.rollout.entropy import EntropyOptions
    from egpo.rollout.sglang.tokenizer_patches import apply_tokenizer_patches
    from egpo.rollout.sglang.versions import sglang_targets

    install_process_entries(EntropyOptions())
    if not sglang_targets().entropy_via_observer:  # the observer's values reach meta_info through sglang itself
        apply_tokenizer_patches()
    set_engine_entries(run_scheduler_with_timers, run_detokenizer_process_with_standins)
    prompt_len = 8
    engine = sglang.Engine(model_path=str(model_dir), device="cpu", attention_backend="torch_native",
                           disable_cuda_graph=True, disable_overlap_schedule=True, dtype="float32", tp_size=1,
                           max_total_tokens=max(batches) * (prompt_len + new_tokens + 2), max_running_requests=max(batches),
                           chunked_prefill_size=max(batches) * prompt_len, mem_fraction_static=0.6, random_seed=0,
                           skip_tokenizer_init=True, log_level="error", **dict(sglang_targets().cpu_engine_args))
    remove_process_entries()  # the children are up; the next engine installs them again
    try:
        for bs in batches:
            prompts = [[10 + (i * 7 + j) % 60 for j in range(prompt_len)] for i in range(bs)]
            engine.generate(input_ids=prompts, return_logprob=True,
                            sampling_params={"max_new_tokens": new_tokens, "temperature": 1.0, "ignore_eos": True})
        timings = engine.get_server_info()["internal_states"][0][TIMINGS_KEY]
    finally:
        engine.shutdown()
    return {int(k): tuple(v) for k, v in timings.items() if int(k) in batches}


def main() -> None:
    args = decode_bench_arguments(__doc__)
    from egpo.rollout.sglang.versions import installed_sglang

    print(f"sglang {installed_sglang()} Engine on the CPU, fp32, {args.new_tokens} new tokens per request, overlap off; "
          "sums over the decode steps at each batch size")
    print("| model | batch | decode steps | step (ms) | entropy (ms) | consume (ms) | share of the step |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model_dir = build_bench_model(Path(tmp) / name, name)
            for bs, (entropy_s, step_s, steps, consume_s) in sorted(
                    measure(model_dir, args.batches, args.new_tokens).items()):
                print(f"| {name} | {bs} | {steps} | {step_s / steps * 1e3:.1f} | {entropy_s / steps * 1e3:.2f} | "
                      f"{consume_s / steps * 1e3:.2f} | {(entropy_s + consume_s) / step_s:.2%} |", flush=True)


if __name__ == "__main__":
    main()
