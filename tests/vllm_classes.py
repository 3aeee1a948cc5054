"""vLLM's real classes, built the way its worker and front end build them (shared by the vLLM contract tests)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

LAYER = ("vLLM lives in its own environment layered on this stack's (README, 'vLLM'; .ci/run builds it): "
         "these tests run there")


def require_vllm():
    from egpo.rollout.vllm.versions import installed_vllm

    if installed_vllm() is None:
        pytest.skip(f"vllm is not installed here; {LAYER}", allow_module_level=True)
    import vllm

    return vllm


def sampling_metadata(temperature, max_num_logprobs, generators=None, top_k=None, allowed_mask=None):
    """``SamplingMetadata`` for a batch; ``temperature`` a list (0 = greedy), as vLLM's input batch makes it."""
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    t = torch.tensor(temperature, dtype=torch.float32)
    greedy = t < 1e-5
    rows = len(temperature)
    values = dict(
        temperature=None if bool(greedy.all()) else t,
        all_greedy=bool(greedy.all()),
        all_random=not bool(greedy.any()),
        top_p=None,
        top_k=None if top_k is None else torch.tensor(top_k, dtype=torch.int32),
        generators=generators or {},
        max_num_logprobs=max_num_logprobs,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(rows),
        presence_penalties=torch.zeros(rows),
        repetition_penalties=torch.ones(rows),
        output_token_ids=[[] for _ in range(rows)],
        allowed_token_ids_mask=allowed_mask,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )
    names = {f.name for f in dataclasses.fields(SamplingMetadata)}
    return SamplingMetadata(**{k: v for k, v in values.items() if k in names})


def engine_core_request(request_id: str, prompt: list[int], logprobs: int | None, output_kind=None):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreRequest

    params = SamplingParams(max_tokens=16, logprobs=logprobs, detokenize=False,
                            output_kind=output_kind or RequestOutputKind.FINAL_ONLY)
    values = dict(request_id=request_id, prompt_token_ids=prompt, mm_features=None, sampling_params=params,
                  pooling_params=None, eos_token_id=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                  data_parallel_rank=None, external_req_id=request_id)
    fields = set(EngineCoreRequest.__struct_fields__)
    return EngineCoreRequest(**{k: v for k, v in values.items() if k in fields})
