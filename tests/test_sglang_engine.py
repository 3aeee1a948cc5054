"""sglang 0.5.6.post2's real engine on the CPU with egpo's patches: entropy returned while it samples.

One engine per option set (about 15 s to start on 2 cores). The model is the demo Qwen3 with a wide
initialisation, so per-token entropies span roughly 0-3 nats. Every case checks: entropy count = log-prob count =
tokens; max abs diff to a float64 recompute <= 1e-4; and, after finish and abort, no per-request state left in
the tokenizer manager or the scheduler.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from conftest import bare_sglang_server
from sglang_required import require_sglang
import torch

from egpo.demo.build import build_model
from egpo.rollout.entropy import EntropyOptions
from sglang_engine import LIVE_KEY, RETRACTED_KEY, load_reference_model, reference, scheduler_state, sglang_engine

require_sglang()

TOL = 1e-4
EOS = 2  # <|im_end|>
PROMPTS = [[5, 6, 7, 8], [1, 10, 11, 12, 13, 14, 3], [20, 21], [30, 31, 32, 33, 34, 35, 36, 37, 38]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("sharp") / "model", initializer_range=0.5)


@pytest.fixture(scope="module")
def ref_model(model_dir):
    return load_reference_model(model_dir)


def check_output(ref_model, prompt, out, *, temperature=1.0, top_k=0, temperature_scaled=False):
    """One finished (or aborted) output against the float64 reference; returns the entropy values."""
    meta = out["meta_info"]
    tokens = out["output_ids"]
    entropy, logprobs = meta["output_token_entropy"], meta["output_token_logprobs"]
    assert len(entropy) == len(logprobs) == len(tokens), (len(entropy), len(logprobs), len(tokens))
    assert [t for _, t, _ in logprobs] == tokens
    if not tokens:
        return []
    ref_h, ref_lp = reference(ref_model, prompt, tokens, temperature=temperature, top_k=top_k,
                              temperature_scaled=temperature_scaled)
    assert (torch.tensor(entropy, dtype=torch.float64) - ref_h).abs().max() <= TOL
    assert (torch.tensor([lp for lp, _, _ in logprobs], dtype=torch.float64) - ref_lp).abs().max() <= TOL
    return entropy


def assert_no_request_state(engine):
    assert not engine.tokenizer_manager.rid_to_state
    state = scheduler_state(engine)
    assert state[LIVE_KEY] == 0


GREEDY = {"max_new_tokens": 48, "temperature": 0.0}
SAMPLING = [
    {"max_new_tokens": 48, "temperature": 1.0},
    {"max_new_tokens": 48, "temperature": 0.7, "top_k": 20},
    {"max_new_tokens": 48, "temperature": 1.3, "top_p": 0.9},
    {"max_new_tokens": 48, "temperature": 1.0, "min_p": 0.05},
]


FIRST_BATCH: dict = {}  # the patched engine's first batch, replayed on an unpatched engine


@pytest.fixture(scope="class")
def default_engine(model_dir):
    with sglang_engine(model_dir, EntropyOptions(), max_total_tokens=4096) as engine:
        yield engine


@pytest.fixture(scope="class")
def options_engine(model_dir):
    """top_k=5 + temperature-scaled entropy, on a KV pool small enough to force retraction."""
    with sglang_engine(model_dir, TestTopKTemperatureScaledAndRetraction.OPTIONS, max_total_tokens=256,
                       chunked_prefill_size=128, max_prefill_tokens=128) as engine:
        yield engine


class TestDefaultOptions:
    """Full-vocabulary entropy of the raw logits (egpo's default)."""

    @pytest.fixture
    def engine(self, default_engine):
        return default_engine

    def test_greedy_and_sampling_batches(self, engine, ref_model):
        params = [dict(GREEDY, ignore_eos=True)] * len(PROMPTS) + [dict(p, ignore_eos=True) for p in SAMPLING]
        prompts = PROMPTS + PROMPTS[: len(SAMPLING)]
        outs = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        FIRST_BATCH.update(prompts=prompts, params=params, outs=outs)
        values = []
        for prompt, param, out in zip(prompts, params, outs):
            assert len(out["output_ids"]) == param["max_new_tokens"]
            values += check_output(ref_model, prompt, out, temperature=param["temperature"])
        # a test of entropy, not of a uniform model: values spread over nats
        assert min(values) < 0.5 and max(values) > 1.5, (min(values), max(values))
        assert_no_request_state(engine)

    def test_stop_token_ends_the_response_with_its_entropy(self, engine, ref_model):
        # a token from the middle of the greedy continuation (before any EOS) is the stop token: the response
        # must end exactly at its first occurrence
        first = engine.generate(input_ids=PROMPTS[1], sampling_params=GREEDY, return_logprob=True)["output_ids"]
        before_eos = first[: first.index(EOS)] if EOS in first else first
        assert len(before_eos) >= 3, first
        stop = before_eos[len(before_eos) // 2]
        out = engine.generate(input_ids=PROMPTS[1], return_logprob=True, sampling_params=dict(GREEDY, stop_token_ids=[stop]))
        assert out["output_ids"] == first[: first.index(stop) + 1]
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
        check_output(ref_model, PROMPTS[1], out)
        assert_no_request_state(engine)

    def test_streaming_chunks_are_aligned_and_cumulative(self, engine, ref_model):
        chunks = []
        for chunk in engine.generate(input_ids=PROMPTS[0], sampling_params=dict(GREEDY, ignore_eos=True),
                                     return_logprob=True, stream=True):
            # sglang 0.5.12 hands every chunk the same log-prob list, which keeps growing after the chunk is sent:
            # completion_tokens is the chunk's own count (0.5.6.post2 copies the list per chunk)
            meta = chunk["meta_info"]
            assert len(meta["output_token_entropy"]) == meta["completion_tokens"] <= len(meta["output_token_logprobs"])
            chunks.append(chunk)
        assert len(chunks) > 3
        final = chunks[-1]
        assert len(final["meta_info"]["output_token_entropy"]) == 48
        previous = chunks[-2]["meta_info"]["output_token_entropy"]
        assert final["meta_info"]["output_token_entropy"][: len(previous)] == previous
        tokens = [t for _, t, _ in final["meta_info"]["output_token_logprobs"]]
        check_output(ref_model, PROMPTS[0], {"output_ids": tokens, "meta_info": final["meta_info"]})
        assert_no_request_state(engine)

    def test_abort_mid_stream_leaves_nothing_behind(self, engine, ref_model):
        stream = engine.generate(input_ids=PROMPTS[2], rid="egpo-abort", return_logprob=True, stream=True,
                                 sampling_params={"max_new_tokens": 400, "temperature": 1.0, "ignore_eos": True})
        seen = None
        for i, chunk in enumerate(stream):
            seen = chunk
            if i == 2:
                engine.tokenizer_manager.abort_request("egpo-abort")
        meta = seen["meta_info"]
        assert meta["finish_reason"]["type"] == "abort"
        assert 0 < len(meta["output_token_entropy"]) == len(meta["output_token_logprobs"]) < 400
        tokens = [t for _, t, _ in meta["output_token_logprobs"]]
        check_output(ref_model, PROMPTS[2], {"output_ids": tokens, "meta_info": meta})
        assert_no_request_state(engine)

    def test_verls_server_generate_on_the_real_tokenizer_manager(self, engine, ref_model):
        """EntropySGLangHttpServer.generate (verl's generate underneath): 12 concurrent requests, then no state."""
        from egpo.rollout.sglang.server import EntropySGLangHttpServer, capture_entropy
        from egpo.keys import ROLLOUT_ENTROPY

        server = bare_sglang_server(EntropySGLangHttpServer, max_model_len=512, prompt_length=32, response_length=24)
        server.tokenizer_manager = engine.tokenizer_manager
        server.global_steps = 3
        capture_entropy(server)
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(12)]

        async def run():
            return await asyncio.gather(*[
                server.generate(p, {"temperature": 1.0, "logprobs": i % 2 == 0}, f"req-{i}")
                for i, p in enumerate(prompts)
            ])

        outputs = engine.loop.run_until_complete(run())
        for i, (prompt, out) in enumerate(zip(prompts, outputs)):
            entropy = out.extra_fields[ROLLOUT_ENTROPY]
            assert len(entropy) == len(out.token_ids) > 0
            assert (out.log_probs is not None) == (i % 2 == 0)  # returned only when asked for
            ref_h, _ = reference(ref_model, prompt, list(out.token_ids))
            assert (torch.tensor(entropy, dtype=torch.float64) - ref_h).abs().max() <= TOL
        assert server._entropy_by_rid == {}
        assert_no_request_state(engine)


class TestTopKTemperatureScaledAndRetraction:
    """top_k=5 + temperature-scaled entropy through egpo's options, on a KV pool small enough to force retraction."""

    OPTIONS = EntropyOptions(top_k=5, temperature_scaled=True)

    @pytest.fixture
    def engine(self, options_engine):
        return options_engine

    def test_options_and_retraction(self, engine, ref_model):
        n = 8
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
        params = [{"max_new_tokens": 90, "temperature": 0.8 if i % 2 else 0.0, "ignore_eos": True} for i in range(n)]
        outs = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        assert scheduler_state(engine)[RETRACTED_KEY] > 0, "the tiny KV pool did not force a retraction"
        for prompt, param, out in zip(prompts, params, outs):
            assert len(out["output_ids"]) == 90
            values = check_output(ref_model, prompt, out, temperature=param["temperature"] or 1.0, top_k=5,
                                  temperature_scaled=bool(param["temperature"]))
            assert max(values) <= torch.log(torch.tensor(5.0)).item() + TOL  # top-5 entropy is at most ln 5
        assert_no_request_state(engine)


def test_patches_change_no_token_and_no_log_prob(model_dir):
    """The first batch of a fresh unpatched engine equals the patched engine's: same tokens, same log probs."""
    if not FIRST_BATCH:
        pytest.skip("runs after TestDefaultOptions.test_greedy_and_sampling_batches")
    with sglang_engine(model_dir, patched=False, max_total_tokens=4096) as engine:
        outs = engine.generate(input_ids=FIRST_BATCH["prompts"], sampling_params=FIRST_BATCH["params"],
                               return_logprob=True)
    for plain, patched in zip(outs, FIRST_BATCH["outs"]):
        assert plain["output_ids"] == patched["output_ids"]
        assert plain["meta_info"]["output_token_logprobs"] == patched["meta_info"]["output_token_logprobs"]
        assert "output_token_entropy" not in plain["meta_info"]


def test_data_parallel_engine_returns_entropy_from_every_scheduler(model_dir, ref_model):
    """dp_size=2 (sglang's data-parallel controller, two schedulers): requests spread over both, each with its
    entropy. sglang 0.5.12 hands the controller the engine's scheduler entry, so egpo's reaches both schedulers;
    0.5.6.post2's controller binds sglang's own (refused at start-up there, egpo.rollout.sglang.limits)."""
    from egpo.rollout.sglang.versions import sglang_targets

    if not sglang_targets().data_parallel_reaches_schedulers:
        pytest.skip("sglang 0.5.6.post2's data-parallel controller is out of egpo's reach (refused at start-up)")
    with sglang_engine(model_dir, EntropyOptions(), dp_size=2, max_total_tokens=2048) as engine:
        params = [dict(GREEDY, ignore_eos=True)] * len(PROMPTS) + [dict(p, ignore_eos=True) for p in SAMPLING]
        prompts = PROMPTS + PROMPTS[: len(SAMPLING)]
        outs = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True)
        for prompt, param, out in zip(prompts, params, outs):
            assert len(out["output_ids"]) == param["max_new_tokens"]
            check_output(ref_model, prompt, out, temperature=param["temperature"])
        states = engine.get_server_info()["internal_states"]
        assert len(states) == 2  # both schedulers answered
