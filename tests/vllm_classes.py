"""vLLM's real classes, built the way its worker and front end build them (shared by the vLLM contract tests)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

LAYER = ("vLLM lives in its own environment layered on this stack's (docs/rollout-entropy.md, 'Rollout entropy from vLLM'; .ci/run builds it): "
         "these tests run there")


def require_vllm():
    from egpo.rollout.vllm.versions import installed_vllm

    if installed_vllm() is None:
        pytest.skip(f"vllm is not installed here; {LAYER}", allow_module_level=True)
    from egpo.rollout.sglang.standins import standins_installed

    if standins_installed():  # sglang's tests ran in this session first, on a CPU: its stand-in answers `import vllm`
        pytest.skip("sglang's CPU stand-ins stand in for vLLM in this session (sglang's tests were collected first): "
                    "vLLM's tests run in a session of their own, python -m pytest -q tests/test_vllm_*.py (.ci/run's "
                    "vLLM lanes)", allow_module_level=True)
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


def engine_core_request(request_id: str, prompt: list[int], logprobs: int | None = None, output_kind=None, params=None):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreRequest

    params = params or SamplingParams(max_tokens=16, logprobs=logprobs, detokenize=False,
                                      output_kind=output_kind or RequestOutputKind.FINAL_ONLY)
    values = dict(request_id=request_id, prompt_token_ids=prompt, mm_features=None, sampling_params=params,
                  pooling_params=None, eos_token_id=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                  data_parallel_rank=None, external_req_id=request_id)
    fields = set(EngineCoreRequest.__struct_fields__)
    return EngineCoreRequest(**{k: v for k, v in values.items() if k in fields})


def lists_with_entropy(token_ids, entropy, k=0, seed=0, vocab=50, patched=True):
    """What the patched worker sends for one request and step: sampled + k top columns + egpo's marked entropy
    column (``patched=False``: what an unpatched worker sends, without it)."""
    import numpy as np
    from vllm.v1.outputs import LogprobsLists

    from egpo.rollout.vllm.entropy_column import ENTROPY_COLUMN_ID

    g = np.random.default_rng(seed)
    n = len(token_ids)
    ids = np.concatenate([np.array(token_ids)[:, None], g.integers(0, vocab, (n, k)),
                          np.full((n, 1), ENTROPY_COLUMN_ID)], 1)
    logprobs = np.concatenate([-g.random((n, k + 1)), np.array(entropy)[:, None]], 1).astype(np.float32)
    if not patched:
        ids, logprobs = ids[:, :-1], logprobs[:, :-1]
    return LogprobsLists(ids.astype(np.int32), logprobs, np.ones(n, dtype=np.int32), None)


class OutputProcessorEngine:
    """An engine client whose ``generate`` answers through vLLM's real ``OutputProcessor``: each step's tokens and
    the patched worker's log-prob lists (entropy column included) go in as ``EngineCoreOutput``s, the request's
    ``RequestOutput``s come out, as vLLM's ``AsyncLLM`` yields them."""

    def __init__(self, steps, patched_worker=True):
        self.steps = steps  # [(token_ids, entropy), ...]
        self.patched_worker = patched_worker  # False: the workers ran without egpo's sampler patch
        self.requests = []

    async def generate(self, prompt, sampling_params, request_id, **kwargs):
        from vllm.v1.engine import EngineCoreOutput, FinishReason
        from vllm.v1.engine.output_processor import OutputProcessor

        self.requests.append(sampling_params)
        processor = OutputProcessor(tokenizer=None, log_stats=False)
        processor.add_request(engine_core_request(request_id, list(prompt["prompt_token_ids"]), params=sampling_params),
                              None)
        for i, (tokens, entropy) in enumerate(self.steps):
            last = i == len(self.steps) - 1
            result = processor.process_outputs([EngineCoreOutput(
                request_id=request_id, new_token_ids=tokens, new_logprobs=lists_with_entropy(tokens, entropy, seed=i, patched=self.patched_worker),
                finish_reason=FinishReason.LENGTH if last else None)])
            for output in result.request_outputs:
                yield output
