"""The vLLM front end's time per engine step with egpo's entropy attached, before and after passing it by reference.

    python bench/vllm_frontend_entropy.py [--requests 256] [--lengths 8192 16384] [--rounds 15]

vLLM's real ``OutputProcessor`` (verl's cumulative outputs, sampled-token log probs on, no detokenizer) handles one
engine step: one new token for each of ``--requests`` running requests whose responses are already ``L`` tokens long.
Three front ends, interleaved, medians: vLLM unpatched; egpo's front-end patch as it was (each output carried a copy
of the request's whole entropy list, ``list(entropy)``: O(L) per request and step); egpo's patch now (the request's
own list, by reference, as vLLM passes its log probs). Runs in a stack's vLLM layer or the CPU engine environment, with ``tests/`` on ``PYTHONPATH``
(``PYTHONPATH=tests python bench/vllm_frontend_entropy.py``); the garbage collector is paused while a step is timed.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time


def build(requests: int, length: int, patched: bool):
    """An ``OutputProcessor`` holding ``requests`` running requests, each ``length`` tokens into its response."""
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm_classes import engine_core_request

    from egpo.rollout.vllm.frontend_patch import ENTROPY_FIELD

    processor = OutputProcessor(tokenizer=None, log_stats=False)
    for i in range(requests):
        processor.add_request(engine_core_request(f"r{i}", [1, 2, 3], logprobs=0,
                                                  output_kind=RequestOutputKind.CUMULATIVE), None)
        if patched:  # the entropy gathered over the response so far, grown as extend grows it (spare capacity)
            gathered = [0.5] * length
            gathered.append(0.5)  # an append over-allocates, as a list grown token by token is
            gathered.pop()
            setattr(processor.request_states[f"r{i}"].logprobs_processor, ENTROPY_FIELD, gathered)
    return processor


def step_outputs(requests: int, patched: bool, seed: int):
    from vllm.v1.engine import EngineCoreOutput
    from vllm_classes import lists_with_entropy

    return [EngineCoreOutput(request_id=f"r{i}", new_token_ids=[7],
                             new_logprobs=lists_with_entropy([7], [0.5], seed=seed, patched=patched))
            for i in range(requests)]


def copying_new_completion_output(original, self, token_ids, finish_reason, stop_reason):
    """egpo's earlier attach, for the 'before' column: a copy of the whole list at every step."""
    from egpo.rollout.vllm import frontend_patch

    output = original(self, token_ids, finish_reason, stop_reason)
    entropy = getattr(self.logprobs_processor, frontend_patch.ENTROPY_FIELD, None)
    if entropy is not None:
        setattr(output, frontend_patch.ENTROPY_FIELD, list(entropy))
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 8192, 16384])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    import vllm

    from egpo.patching import Patch, remove_all
    from egpo.rollout.vllm import frontend_patch

    copying = Patch(frontend_patch.NEW_OUTPUT.target, copying_new_completion_output)
    every_patch = (*frontend_patch.PATCHES, copying)

    def timed(variant: str, length: int, seed: int) -> float:
        remove_all(every_patch)
        patched = variant != "vllm"
        if variant == "reference":
            frontend_patch.apply_frontend_patch()
        elif variant == "copy":
            frontend_patch.UPDATE.apply()
            copying.apply()
        processor = build(args.requests, length, patched)
        outputs = step_outputs(args.requests, patched, seed)
        gc.collect()
        gc.disable()  # a collection would traverse the bench's pre-grown lists, which a real step did not build
        start = time.perf_counter()
        processor.process_outputs(outputs)
        elapsed = time.perf_counter() - start
        gc.enable()
        remove_all(every_patch)
        return elapsed

    variants = ("vllm", "copy", "reference")
    print(f"vllm {vllm.__version__}: front-end time of one engine step, {args.requests} running requests x one new "
          f"token, cumulative outputs; {args.rounds} interleaved rounds, medians")
    print("| response length so far | vLLM (ms) | egpo, list copied per step (ms) | egpo, by reference (ms) | "
          "copy / vLLM | reference / vLLM |")
    print("|---|---|---|---|---|---|")
    for length in args.lengths:
        for variant in variants:
            timed(variant, length, 0)  # warm-up
        times = {variant: [] for variant in variants}
        for r in range(args.rounds):
            for variant in variants:
                times[variant].append(timed(variant, length, r))
        m = {variant: statistics.median(t) * 1e3 for variant, t in times.items()}
        print(f"| {length} | {m['vllm']:.2f} | {m['copy']:.2f} | {m['reference']:.2f} | "
              f"{m['copy'] / m['vllm']:.2f}x | {m['reference'] / m['vllm']:.2f}x |")


if __name__ == "__main__":
    main()
