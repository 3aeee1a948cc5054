"""Cost of egpo's entropy patch on sglang's real ``Sampler.forward``, as a ratio to the unpatched sampler.

    python bench/sampler_patch.py [--device cpu|cuda] [--vocab 151936] [--batches 1 32 256]

Same logits, same sampling settings (temperature 0.7, top-p/top-k off: sglang's direct sampling path),
sglang's ``pytorch`` sampling backend; patched and unpatched runs interleaved, medians reported. Needs sglang
0.5.6.post2's Python modules (``pip install --no-deps sglang==0.5.6.post2`` plus
.ci/sglang-cpu-requirements.txt); the CUDA-only imports get stand-ins.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch
from interleaved import patch_bench_arguments, print_patch_table

from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.sglang.standins import install_standins


def main() -> None:
    args = patch_bench_arguments(__doc__)

    install_standins()
    import sglang.srt.layers.sampler as sampler_mod
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    from egpo.rollout.sglang import sampler_patch

    server_args = SimpleNamespace(enable_nan_detection=False, rl_on_policy_target=None, sampling_backend="pytorch")
    sampler_mod.get_global_server_args = lambda: server_args
    sampler_mod.get_tp_group = lambda: SimpleNamespace(device_group=None)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def info(bs):
        return SamplingBatchInfo(
            temperatures=torch.full((bs, 1), 0.7, device=dev), top_ps=torch.ones(bs, device=dev),
            top_ks=torch.full((bs,), args.vocab, dtype=torch.int32, device=dev), min_ps=torch.zeros(bs, device=dev),
            is_all_greedy=False, need_top_p_sampling=False, need_top_k_sampling=False, need_min_p_sampling=False,
            vocab_size=args.vocab, device=args.device,
        )

    def timed(x, bs, patched):
        if patched:
            sampler_patch.apply_sampler_patch(EntropyOptions())
        else:
            sampler_patch.SAMPLER_FORWARD.remove()
        sampler = sampler_mod.Sampler()
        out = LogitsProcessorOutput(next_token_logits=x.clone())
        batch_info = info(bs)
        sync()
        start = time.perf_counter()
        sampler.forward(out, batch_info, False, [0] * bs, [None] * bs, torch.arange(bs, device=dev))
        sync()
        return time.perf_counter() - start

    print(f"device {args.device}, vocab {args.vocab}, fp32 logits, {args.rounds} interleaved rounds, medians")
    print_patch_table(timed, args.batches, args.vocab, args.rounds, dev)
    sampler_patch.SAMPLER_FORWARD.remove()


if __name__ == "__main__":
    main()
