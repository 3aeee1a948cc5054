"""The HF rollout server in-process (its Ray wrapper adds nothing): batching, alignment, weights, sampling rules."""

import asyncio

import pytest
import torch
from hydra import compose, initialize_config_module

from egpo.demo.build import build_model
from egpo.rollout.hf.sampling import resolve_sampling
from egpo.rollout.hf.server import HFRolloutServer
from egpo.keys import ROLLOUT_ENTROPY
from test_hf_generate import recompute


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory):
    return build_model(tmp_path_factory.mktemp("demo") / "model")


def make_server(model_path, *overrides) -> HFRolloutServer:
    with initialize_config_module("egpo.config", version_base=None):
        cfg = compose(
            "egpo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_path}",
                "data.max_prompt_length=48",
                "data.max_response_length=16",
                "actor_rollout_ref.rollout.name=hf",
                *overrides,
            ],
        )
    server = HFRolloutServer(cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model)
    asyncio.run(server.launch_server())
    return server


def prompts(server, questions):
    tok = server.model_config.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False) for q in questions]


async def generate_all(server, prompt_list, **params):
    return await asyncio.gather(
        *[server.generate(p, dict(params), request_id=str(i)) for i, p in enumerate(prompt_list)]
    )


def test_concurrent_requests_are_batched_and_aligned(demo_model):
    server = make_server(demo_model)
    ps = prompts(server, ["What is 1+1?", "What is 12345+67890?", "What is 7+88?"] * 2)
    outs = asyncio.run(generate_all(server, ps, temperature=1.0, top_p=1.0, top_k=-1, logprobs=True))
    assert server._batches == 1  # one gathered batch, not six
    for prompt, out in zip(ps, outs):
        entropy = out.extra_fields[ROLLOUT_ENTROPY]
        assert 0 < len(out.token_ids) <= 16 and len(entropy) == len(out.log_probs) == len(out.token_ids)
        assert out.stop_reason in ("completed", "length")
        lp, h = recompute(server.model, prompt, out.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(out.log_probs), lp, rtol=0, atol=1e-4)
        torch.testing.assert_close(torch.tensor(entropy), h, rtol=0, atol=1e-4)
    # log probs only when asked; entropy always
    (plain,) = asyncio.run(generate_all(server, ps[:1], temperature=1.0))
    assert plain.log_probs is None and len(plain.extra_fields[ROLLOUT_ENTROPY]) == len(plain.token_ids)


def test_top_k_entropy_option_reaches_the_server(demo_model):
    server = make_server(demo_model, "actor_rollout_ref.rollout.custom.entropy.top_k=2")
    (out,) = asyncio.run(generate_all(server, prompts(server, ["What is 2+2?"]), temperature=1.0))
    assert max(out.extra_fields[ROLLOUT_ENTROPY]) <= float(torch.log(torch.tensor(2.0))) + 1e-6


def test_pushed_weights_are_used_and_must_cover_the_model(demo_model, tmp_path):
    from transformers import AutoModelForCausalLM

    server = make_server(demo_model)
    other = AutoModelForCausalLM.from_pretrained(build_model(tmp_path / "other", seed=7), attn_implementation="eager")
    (p,) = prompts(server, ["What is 5+6?"])
    before = asyncio.run(generate_all(server, [p], temperature=0.0, logprobs=True))[0]
    asyncio.run(server.update_weights(other.state_dict(), global_steps=3))
    after = asyncio.run(generate_all(server, [p], temperature=0.0, logprobs=True))[0]
    assert after.extra_fields["global_steps"] == 3
    lp, _ = recompute(other.eval(), p, after.token_ids, 1.0)
    torch.testing.assert_close(torch.tensor(after.log_probs), lp, rtol=0, atol=1e-4)
    assert after.token_ids != before.token_ids or after.log_probs != before.log_probs

    partial = {k: v for k, v in other.state_dict().items() if "layers.0." not in k}
    with pytest.raises(RuntimeError, match="missing"):
        asyncio.run(server.update_weights(partial))


def test_unsupported_request_settings_fail_by_name(demo_model):
    server = make_server(demo_model)
    (p,) = prompts(server, ["What is 1+2?"])
    with pytest.raises(ValueError, match="min_p"):
        asyncio.run(generate_all(server, [p], min_p=0.1))
    with pytest.raises(NotImplementedError, match="text-only"):
        asyncio.run(server.generate(p, {}, request_id="x", image_data=[object()]))


def resolve(params, prompt_len=10, **kw):
    args = dict(prompt_len=prompt_len, prompt_length=16, response_length=8, max_model_len=None, eos_token_ids=(2,))
    args.update(kw)
    return resolve_sampling(params, **args)


def test_sampling_rules():
    s = resolve({"temperature": 0.7, "top_k": None, "logprobs": True})
    assert (s.max_new_tokens, s.temperature, s.top_k, s.stop_token_ids, s.return_log_probs) == (8, 0.7, -1, (2,), True)
    assert resolve({}, prompt_len=20).max_new_tokens == 4  # verl's rule: the prompt's overflow eats the response
    assert resolve({"max_tokens": 3}).max_new_tokens == 3
    assert resolve({"max_new_tokens": 100}).max_new_tokens == 14  # clamped to the context left
    assert resolve({"stop_token_ids": [9, 2]}).stop_token_ids == (9, 2)
    assert resolve({"stop_token_ids": [9], "ignore_eos": True}).stop_token_ids == (9,)
    with pytest.raises(ValueError, match="n=1"):
        resolve({"n": 4})
    with pytest.raises(ValueError, match="repetition_penalty"):
        resolve({"repetition_penalty": 1.1})
    with pytest.raises(ValueError, match="no room"):
        resolve({}, prompt_len=24)


def test_samples_do_not_depend_on_batching_or_arrival(demo_model):
    """The same requests, (a) gathered into one batch, (b) one per batch in reversed order with pauses between
    arrivals: every prompt receives the same samples."""
    questions = ["What is 1+1?", "What is 12+9?", "What is 7+88?", "What is 3+3?"]
    params = dict(temperature=1.0, top_p=0.95, top_k=-1, logprobs=True)

    together = make_server(demo_model)
    ps = prompts(together, questions) * 3  # three copies of each prompt
    asyncio.run(together.set_global_steps(4))
    batched = asyncio.run(generate_all(together, ps, **params))
    assert together._batches == 1

    apart = make_server(demo_model, "actor_rollout_ref.rollout.max_num_seqs=1")
    asyncio.run(apart.set_global_steps(4))

    async def one_by_one():
        outs = {}
        for i in reversed(range(len(ps))):
            outs[i] = await apart.generate(ps[i], dict(params), request_id=f"r{i}")
            await asyncio.sleep(0.06)  # past the gather window: a new batch each time
        return [outs[i] for i in range(len(ps))]

    single = asyncio.run(one_by_one())
    assert apart._batches == len(ps)

    def samples_by_prompt(outs):
        by_prompt = {}
        for p, out in zip(ps, outs):
            by_prompt.setdefault(tuple(p), []).append((list(out.token_ids), out.log_probs))
        return {k: sorted(v, key=lambda s: s[0]) for k, v in by_prompt.items()}

    a, b = samples_by_prompt(batched), samples_by_prompt(single)
    assert a.keys() == b.keys()
    for key in a:
        assert [t for t, _ in a[key]] == [t for t, _ in b[key]]
        for (_, lp_a), (_, lp_b) in zip(a[key], b[key]):
            torch.testing.assert_close(torch.tensor(lp_a), torch.tensor(lp_b), rtol=0, atol=1e-5)
    # copies of one prompt get different samples, and a new weights version draws new ones
    assert any(len({tuple(t) for t, _ in v}) > 1 for v in a.values())
    asyncio.run(together.set_global_steps(5))
    again = asyncio.run(generate_all(together, ps, **params))
    assert [list(o.token_ids) for o in again] != [list(o.token_ids) for o in batched]


def outputs_by_prompt(ps, outs):
    """Each prompt's samples (tokens, log probs, entropy), in token order: what a run keeps of a round."""
    by_prompt = {}
    for p, out in zip(ps, outs):
        by_prompt.setdefault(tuple(p), []).append(
            (list(out.token_ids), list(out.log_probs), list(out.extra_fields[ROLLOUT_ENTROPY])))
    return {k: sorted(v) for k, v in by_prompt.items()}


async def trickle(server, ps, order, pause, **params):
    """The requests sent in ``order``, ``pause`` seconds apart, all in flight together."""
    tasks = {}
    for i in order:
        tasks[i] = asyncio.create_task(server.generate(ps[i], dict(params), request_id=f"r{i}"))
        await asyncio.sleep(pause)
    return [await tasks[i] for i in range(len(ps))]


def test_an_announced_round_is_batched_alike_however_its_requests_arrive(demo_model):
    """Arrival timing decides batches without an announcement; with one, a round's requests are batched together
    whatever their order and pauses, and give bit-identical samples, log probs and entropy."""
    questions = ["What is 1+1?", "What is 12+9?", "What is 7+88?", "What is 345+6789?"]
    params = dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=True)

    def run(order, pause, announce):
        server = make_server(demo_model)
        ps = prompts(server, questions) * 2

        async def go():
            await server.set_global_steps(3)
            if announce:
                await server.expect_round(len(ps))
            return await trickle(server, ps, order, pause, **params)

        return server, ps, asyncio.run(go())

    n = 2 * len(questions)
    unannounced, _, _ = run(range(n), 0.3, announce=False)
    assert unannounced._batches > 1  # arrivals past the gather window split the requests

    together, ps, outs = run(range(n), 0, announce=True)
    slow, _, slow_outs = run(reversed(range(n)), 0.12, announce=True)
    assert together._batches == slow._batches == 1
    assert outputs_by_prompt(ps, slow_outs) == outputs_by_prompt(ps, outs)  # exactly, not within a tolerance
    assert slow._round_left == 0


def test_a_round_that_never_completes_is_generated_with_a_warning(demo_model, monkeypatch, caplog):
    import egpo.rollout.hf.server as server_module

    monkeypatch.setattr(server_module, "ROUND_WAIT_S", 0.3)
    server = make_server(demo_model)
    ps = prompts(server, ["What is 1+1?", "What is 2+2?"])

    async def go():
        await server.expect_round(len(ps) + 3)
        return await generate_all(server, ps, temperature=1.0, top_p=1.0, top_k=-1, logprobs=True)

    with caplog.at_level("WARNING", logger=server_module.__name__):
        outs = asyncio.run(go())
    assert len(outs) == 2 and all(o.token_ids for o in outs) and server._round_left == 0
    assert "3 of the 5 requests announced for this round did not arrive" in caplog.text
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="request count"):
            asyncio.run(server.expect_round(bad))


def test_rounds_are_announced_to_a_single_hf_server_only(caplog):
    from egpo.rollout.hf.rounds import RoundAnnouncer

    class Server:
        def __init__(self):
            self.told = []
            self.expect_round = self

        def remote(self, count):
            self.told.append(count)
            return asyncio.sleep(0)

    one = Server()
    finds = []
    announcer = RoundAnnouncer(lambda: finds.append(1) or [one])
    assert asyncio.run(announcer.announce(32)) and asyncio.run(announcer.announce(64))
    assert one.told == [32, 64] and finds == [1]  # found once

    a, b = Server(), Server()
    with caplog.at_level("WARNING"):
        assert not asyncio.run(RoundAnnouncer(lambda: [a, b]).announce(8))
    assert a.told == b.told == [] and "2 hf rollout replicas" in caplog.text
    assert not asyncio.run(RoundAnnouncer(lambda: []).announce(8))  # not an hf rollout: nothing to tell


def test_a_row_key_decides_the_sample_whatever_the_arrival_order(demo_model):
    """Without a row key, copies of one prompt take their samples in arrival order; with egpo's row key each row
    keeps its own sample (two data-set rows with the same prompt must not trade samples: that changes GRPO groups)."""
    from egpo.keys import SAMPLE_KEY

    params = dict(temperature=1.0, top_p=1.0, top_k=-1, logprobs=True)
    rows = [(7, n, False) for n in range(3)] + [(9, n, False) for n in range(3)]  # two data-set rows, one prompt

    def run(order, keyed):
        server = make_server(demo_model)
        p = prompts(server, ["What is 7+1?"])[0]

        async def go():
            await server.set_global_steps(2)
            outs = {}
            for i in order:  # one at a time: the arrival order is exactly ``order``
                extra = {SAMPLE_KEY: rows[i]} if keyed else {}
                outs[i] = await server.generate(p, {**params, **extra}, request_id=f"r{i}")
            return [list(outs[i].token_ids) for i in range(len(rows))]

        return asyncio.run(go())

    forward, backward = range(len(rows)), list(reversed(range(len(rows))))
    keyed = run(forward, keyed=True)
    assert run(backward, keyed=True) == keyed
    assert len({tuple(t) for t in keyed}) > 1  # the rows' samples differ from one another
    unkeyed = run(forward, keyed=False)
    assert run(backward, keyed=False) == unkeyed[::-1]  # the n-th arrival gets the n-th sample
    assert unkeyed != keyed


def test_the_worker_keys_hf_requests_by_row_only(monkeypatch):
    import numpy as np
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from egpo.keys import SAMPLE_KEY
    from egpo.rollout.agent_loop import EntropyAgentLoopWorker, sample_key

    trajectory = {"step": 3, "sample_index": np.int64(41), "rollout_n": np.int64(2), "validate": np.bool_(False)}
    key = sample_key(trajectory)
    assert key == (41, 2, False) and repr(key) == "(41, 2, False)"  # plain values: one seed on numpy 1 and 2
    assert sample_key({**trajectory, "sample_index": "q-17"})[0] == "q-17"

    seen = []

    async def verls(self, sampling_params, trajectory, **kwargs):
        seen.append((sampling_params, kwargs))

    monkeypatch.setattr(AgentLoopWorker, "_run_agent_loop", verls)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)  # a GPU's workers (vLLM on a CPU: below)
    worker = EntropyAgentLoopWorker.__new__(EntropyAgentLoopWorker)
    shared = {"temperature": 1.0}
    for name in ("hf", "sglang", "vllm"):
        worker.rollout_config = type("Rollout", (), {"name": name})()
        asyncio.run(worker._run_agent_loop(shared, trajectory, agent_name="single_turn_agent", trace=False))
    (hf, hf_kwargs), (sglang, _), (vllm, _) = seen
    assert hf == {"temperature": 1.0, SAMPLE_KEY: (41, 2, False)} and sglang == vllm == shared == {"temperature": 1.0}
    assert hf_kwargs == {"agent_name": "single_turn_agent", "trace": False}

    # vLLM on egpo's CPU platform: vLLM's own per-request seed, from the rollout seed, the step and the row
    from egpo.rollout.agent_loop import row_seed
    from egpo.rollout.hf.seeded_sampling import request_seed

    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    worker.rollout_config = type("Rollout", (), {"name": "vllm", "seed": 5})()
    asyncio.run(worker._run_agent_loop(shared, trajectory, agent_name="single_turn_agent", trace=False))
    assert seen[-1][0] == {"temperature": 1.0, "seed": request_seed(5, 3, 41, 2, False)}
    assert row_seed(worker.rollout_config, trajectory) == request_seed(5, 3, 41, 2, False)
