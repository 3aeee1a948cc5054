"""vLLM rollout entropy on vLLM's real classes (0.12.0 with verl 0.7.1, 0.24.0 with verl 0.9.1): the patched
sampler on real logits against a float64 reference, the extra column through vLLM's per-request slicing and the
engine-core message, and the front end's log-prob processing into the request output."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from vllm_classes import engine_core_request, lists_with_entropy, require_vllm, sampling_metadata

pytestmark = pytest.mark.vllm
vllm = require_vllm()

from egpo.patching import remove_all  # noqa: E402
from egpo.rollout.entropy import EntropyOptions  # noqa: E402
from reference import entropy_rows_ref  # noqa: E402
from egpo.rollout.vllm import frontend_patch, sampler_patch  # noqa: E402
from egpo.rollout.vllm.entropy_column import ENTROPY_COLUMN_ID  # noqa: E402
from egpo.rollout.vllm.versions import (  # noqa: E402
    SUPPORTED, TARGETS, VllmPatchTargetError, candidate_versions, check_targets, vllm_targets)

V = 50


def entropy64(logits: torch.Tensor, temperature=None, top_k: int = 0) -> torch.Tensor:
    return torch.tensor(entropy_rows_ref(logits, temperature, top_k), dtype=torch.float64)


def batch_logits(seed: int = 0, rows: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g) * 3
    logits[0, 5:] = float("-inf")  # a masked row (grammar-like)
    logits[1, :] = -1e4
    logits[1, 7] = 60.0  # nearly one-hot, large values
    return logits


def generators(rows: int, seed: int = 1234):
    return {i: torch.Generator().manual_seed(seed + i) for i in range(rows)}


@pytest.fixture
def patched():
    yield lambda options=EntropyOptions(): sampler_patch.apply_sampler_patch(options)
    remove_all(sampler_patch.PATCHES)


def test_installed_version_is_supported_and_its_targets_have_their_shape():
    """A tested version passes with its own table; an untested one inside a range with a bracketing version's."""
    assert check_targets() in [TARGETS[v] for v in candidate_versions(vllm.__version__)]
    if vllm.__version__ in SUPPORTED:
        assert check_targets() is TARGETS[vllm.__version__]
    with pytest.raises(VllmPatchTargetError, match=r"needs vllm 0\.12\.0; 0\.24\.0 to 0\.33\.0"):
        vllm_targets("0.11.2")


def test_a_version_inside_a_range_runs_with_the_bracketing_table_its_classes_match():
    """Checked by shape on these real classes as if they were an untested 0.26.0 (between tested 0.24.0 and 0.29.0):
    0.24.0's classes match 0.24.0's table, 0.29.0's and 0.33.0's match 0.29.0's (their log-prob tensors have one
    field more); 0.12.0's are outside that range's shapes altogether."""
    installed = vllm.__version__
    if installed == "0.12.0":
        with pytest.raises(VllmPatchTargetError, match=r"against vllm 0\.24\.0's table.*against vllm 0\.29\.0's table"):
            check_targets("0.26.0")
    else:
        assert check_targets("0.26.0") is TARGETS["0.24.0" if installed == "0.24.0" else "0.29.0"]


@pytest.mark.parametrize("temperature", [[1.0] * 6, [0.0, 0.7, 1.0, 0.0, 1.3, 0.5], [0.0] * 6])
def test_entropy_column_against_float64(patched, temperature):
    from vllm.v1.sample.sampler import Sampler

    logits = batch_logits()
    patched()
    out = Sampler(logprobs_mode="processed_logprobs")(logits.clone(), sampling_metadata(temperature, 2, generators(6)))
    tensors = out.logprobs_tensors
    assert tuple(tensors.logprobs.shape) == (6, 4)  # sampled + top-2 + the entropy column
    torch.testing.assert_close(tensors.logprobs[:, -1].double(), entropy64(logits), rtol=1e-5, atol=1e-5)
    assert (tensors.logprob_token_ids[:, -1] == ENTROPY_COLUMN_ID).all()  # egpo's mark, no vocabulary id
    assert getattr(Sampler, sampler_patch.STASH, None) is None


def test_entropy_after_masks_before_temperature(patched):
    """The allowed-token mask is applied before sampling: the entropy is of the masked distribution."""
    from vllm.v1.sample.sampler import Sampler

    logits = batch_logits(1)
    mask = torch.zeros(6, V, dtype=torch.bool)
    mask[:, 30:] = True  # disallowed
    patched()
    sampler = Sampler(logprobs_mode="raw_logprobs")
    out = sampler(logits.clone(), sampling_metadata([0.7] * 6, 0, generators(6), allowed_mask=mask))
    masked = logits.masked_fill(mask, float("-inf"))
    torch.testing.assert_close(out.logprobs_tensors.logprobs[:, -1].double(), entropy64(masked), rtol=1e-5, atol=1e-5)
    assert (out.sampled_token_ids < 30).all()
    assert getattr(sampler, sampler_patch.STASH) is None  # nothing left on the sampler between steps


@pytest.mark.parametrize("options", [EntropyOptions(top_k=5), EntropyOptions(temperature_scaled=True),
                                     EntropyOptions(top_k=3, temperature_scaled=True)])
def test_options(patched, options):
    from vllm.v1.sample.sampler import Sampler

    logits = batch_logits(2)
    temperature = [0.0, 0.7, 1.0, 0.0, 1.3, 0.5]
    patched(options)
    out = Sampler()(logits.clone(), sampling_metadata(temperature, 0, generators(6)))
    expected = entropy64(logits, temperature if options.temperature_scaled else None, options.top_k)
    torch.testing.assert_close(out.logprobs_tensors.logprobs[:, -1].double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
def test_tokens_and_log_probs_identical_to_an_unpatched_sampler(patched, mode):
    from vllm.v1.sample.sampler import Sampler

    logits = batch_logits(3)
    temperature = [0.0, 0.7, 1.0, 0.9, 1.3, 0.5]
    plain = Sampler(logprobs_mode=mode)(logits.clone(), sampling_metadata(temperature, 3, generators(6), top_k=[V, 5, V, 3, V, 10]))
    patched()
    ours = Sampler(logprobs_mode=mode)(logits.clone(), sampling_metadata(temperature, 3, generators(6), top_k=[V, 5, V, 3, V, 10]))
    assert torch.equal(plain.sampled_token_ids, ours.sampled_token_ids)
    assert torch.equal(plain.logprobs_tensors.logprobs, ours.logprobs_tensors.logprobs[:, :-1])
    assert torch.equal(plain.logprobs_tensors.logprob_token_ids, ours.logprobs_tensors.logprob_token_ids[:, :-1])
    assert torch.equal(plain.logprobs_tensors.selected_token_ranks, ours.logprobs_tensors.selected_token_ranks)


def test_no_log_probs_requested_adds_nothing(patched):
    from vllm.v1.sample.sampler import Sampler

    patched()
    out = Sampler()(batch_logits(4), sampling_metadata([1.0] * 6, None, generators(6)))
    assert out.logprobs_tensors is None


def test_column_rides_the_per_request_slicing_and_the_engine_core_message(patched):
    """Rows sliced per request as vLLM's scheduler slices them (a request stopped after fewer tokens keeps only its
    rows), then the engine-core message encoded and decoded by vLLM's own msgpack codec."""
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    patched()
    logits = batch_logits(5)
    out = Sampler()(logits.clone(), sampling_metadata([1.0] * 6, 1, generators(6)))
    lists = out.logprobs_tensors.tolists()
    expected = entropy64(logits)
    first, second = lists.slice_request(0, 4), lists.slice_request(4, 2)  # two requests: 4 and 2 positions
    sent = EngineCoreOutputs(outputs=[
        EngineCoreOutput(request_id="a", new_token_ids=out.sampled_token_ids[:4, 0].tolist(), new_logprobs=first),
        EngineCoreOutput(request_id="b", new_token_ids=out.sampled_token_ids[4:, 0].tolist()[:1],
                         new_logprobs=second.slice_request(0, 1) if hasattr(second, "slice_request") else second),
    ])
    received = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(sent))
    a, b = received.outputs
    np.testing.assert_allclose(a.new_logprobs.logprobs[:, -1], expected[:4].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(b.new_logprobs.logprobs[:, -1], expected[4:5].numpy(), rtol=1e-5, atol=1e-5)
    assert a.new_logprobs.logprobs.shape == (4, 3) and b.new_logprobs.logprobs.shape == (1, 3)


@pytest.fixture
def frontend():
    frontend_patch.apply_frontend_patch()
    yield
    remove_all(frontend_patch.PATCHES)


@pytest.mark.parametrize("kind", ["FINAL_ONLY", "DELTA", "CUMULATIVE"])
def test_front_end_takes_the_column_off_and_attaches_the_entropy(frontend, kind):
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreOutput, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor

    output_kind = getattr(RequestOutputKind, kind)
    processor = OutputProcessor(tokenizer=None, log_stats=False)
    processor.add_request(engine_core_request("r", [1, 2, 3], logprobs=0, output_kind=output_kind), None)
    steps = [([5, 6], [0.5, 0.25]), ([7], [1.5]), ([8, 9], [0.0, 2.0])]
    seen, logprob_lists = [], []
    for i, (tokens, entropy) in enumerate(steps):
        last = i == len(steps) - 1
        lists = lists_with_entropy(tokens, entropy, seed=i)
        logprob_lists.append(lists.logprobs[:, 0])
        result = processor.process_outputs([EngineCoreOutput(
            request_id="r", new_token_ids=tokens, new_logprobs=lists,
            finish_reason=FinishReason.LENGTH if last else None)])
        for request_output in result.request_outputs:
            seen.append(request_output.outputs[0])
    all_entropy = [e for _, es in steps for e in es]
    if kind == "DELTA":
        assert [o.egpo_entropy for o in seen] == [es for _, es in steps]
        assert [len(o.logprobs) for o in seen] == [len(t) for t, _ in steps]
    else:
        final = seen[-1]
        assert final.token_ids == [5, 6, 7, 8, 9] and final.egpo_entropy == pytest.approx(all_entropy)
        # vLLM's own log probs are those of the sampled tokens, the entropy column gone from every position
        assert [p[t].logprob for p, t in zip(final.logprobs, final.token_ids)] == \
            pytest.approx(np.concatenate(logprob_lists).tolist())
        assert all(len(p) == 1 for p in final.logprobs)
    assert processor.request_states == {}  # nothing per request left once it finished


@pytest.mark.parametrize("kind", ["FINAL_ONLY", "CUMULATIVE"])
def test_front_end_attaches_the_requests_own_list(frontend, kind):
    """Cumulative outputs carry the request's entropy list itself, as vLLM carries its log probs: no per-step copy of
    a growing list (each step's output is the same object, extended)."""
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreOutput, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor

    processor = OutputProcessor(tokenizer=None, log_stats=False)
    processor.add_request(engine_core_request("r", [1, 2], logprobs=0,
                                              output_kind=getattr(RequestOutputKind, kind)), None)
    state = processor.request_states["r"]
    seen = []
    for i in range(4):
        result = processor.process_outputs([EngineCoreOutput(
            request_id="r", new_token_ids=[5 + i], new_logprobs=lists_with_entropy([5 + i], [0.1 * i], seed=i),
            finish_reason=FinishReason.LENGTH if i == 3 else None)])
        seen += [out.outputs[0].egpo_entropy for out in result.request_outputs]
    assert seen[-1] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert all(entropy is getattr(state.logprobs_processor, frontend_patch.ENTROPY_FIELD) for entropy in seen)


@pytest.mark.parametrize("k", [0, 2])
def test_rows_from_an_unpatched_worker_pass_whole_and_carry_no_entropy(frontend, k):
    """A worker without the sampler patch sends no marked column: vLLM's own log probs go through untouched (no
    column stripped, no IndexError in vLLM's output handler) and no entropy is attached."""
    from vllm.v1.engine import EngineCoreOutput, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor

    processor = OutputProcessor(tokenizer=None, log_stats=False)
    processor.add_request(engine_core_request("r", [1, 2], logprobs=k), None)
    lists = lists_with_entropy([5, 6], [0.5, 0.25], k=k, patched=False)
    result = processor.process_outputs([EngineCoreOutput(request_id="r", new_token_ids=[5, 6], new_logprobs=lists,
                                                         finish_reason=FinishReason.LENGTH)])
    output = result.request_outputs[0].outputs[0]
    assert getattr(output, frontend_patch.ENTROPY_FIELD, None) is None
    assert [p[t].logprob for p, t in zip(output.logprobs, output.token_ids)] == \
        pytest.approx(lists.logprobs[:, 0].tolist())


@pytest.mark.parametrize("order", ["sampler_first", "frontend_first"])
def test_both_patches_in_one_process_in_either_order(order):
    """A one-process engine (or a front end that also loads the plugin) holds both patches: each guard checks vLLM's
    own targets, not egpo's wrappers already in place."""
    patches = [lambda: sampler_patch.apply_sampler_patch(EntropyOptions()), frontend_patch.apply_frontend_patch]
    try:
        for apply in patches if order == "sampler_first" else patches[::-1]:
            apply()
        check_targets()
    finally:
        remove_all(sampler_patch.PATCHES)
        remove_all(frontend_patch.PATCHES)
    from vllm.v1.sample.sampler import Sampler

    assert not hasattr(Sampler.forward, "__egpo_patch__")
    check_targets()


@pytest.mark.parametrize("options", [EntropyOptions(), EntropyOptions(top_k=5, temperature_scaled=True)])
def test_the_compiled_kernel_is_warmed_once_before_the_first_kernel_call(patched, monkeypatch, options):
    """On an accelerator the sampler's first call warms every shape vLLM will use (1 row included: vLLM's warm-up
    never samples one row) before its own kernel call, once per worker; the values are unchanged."""
    from vllm.v1.sample.sampler import Sampler

    from egpo.rollout.vllm import worker_entropy

    calls = []
    monkeypatch.setattr(worker_entropy, "uses_compiled_kernel", lambda logits: True)
    monkeypatch.setitem(worker_entropy._worker, "warmed", False)
    monkeypatch.setattr(worker_entropy, "warm_compiled_kernel",
                        lambda width, device, temperature_scaled: calls.append(("warm", width, str(device),
                                                                                temperature_scaled)))
    real = worker_entropy.token_entropy
    monkeypatch.setattr(worker_entropy, "token_entropy",
                        lambda logits, compiled, **kw: calls.append(("kernel", logits.shape[0], compiled)) or
                        real(logits, compiled=False, **kw))
    patched(options)
    logits = batch_logits(6)
    temperature = [0.0, 0.7, 1.0, 0.0, 1.3, 0.5]
    for rows in (6, 1, 6):
        out = Sampler()(logits[:rows].clone(), sampling_metadata(temperature[:rows], 0, generators(rows)))
    expected = entropy64(logits[:6], temperature if options.temperature_scaled else None, options.top_k)
    torch.testing.assert_close(out.logprobs_tensors.logprobs[:, -1].double(), expected, rtol=1e-5, atol=1e-5)
    width = options.top_k or V
    assert calls == [("warm", width, "cpu", options.temperature_scaled), ("kernel", 6, True), ("kernel", 1, True),
                     ("kernel", 6, True)]


@pytest.mark.skipif(not vllm_targets().serves_runner_v2, reason="vLLM 0.12.0: egpo serves the V1 model runner only")
@pytest.mark.parametrize("options", [EntropyOptions(), EntropyOptions(top_k=5, temperature_scaled=True)])
def test_runner_v2_takes_the_entropy_before_its_in_place_temperature(monkeypatch, options):
    """Model Runner V2's real ``SamplingStates.apply_temperature``, wrapped: the entropy of the logits it is handed,
    before it divides them in place. Its Triton kernel is replaced by the same division in torch (no Triton here; the
    engine test runs the kernel, tests/test_vllm_engine.py), and its pinned buffers by their host arrays."""
    from types import SimpleNamespace

    from vllm.v1.worker.gpu.sample import states as states_module

    from egpo.rollout.vllm import runner_v2_patch

    def divide(logits, expanded_idx_mapping, temperature):
        t = temperature[expanded_idx_mapping]
        logits.div_(torch.where(t > 0, t, torch.ones_like(t)).unsqueeze(1))

    monkeypatch.setattr(states_module, "apply_temperature", divide)
    runner_v2_patch.apply_runner_v2_patch(options)
    try:
        temperature = np.array([0.0, 0.7, 1.0, 0.0, 1.3, 0.5], dtype=np.float32)
        states = states_module.SamplingStates.__new__(states_module.SamplingStates)
        states.temperature = SimpleNamespace(np=temperature, gpu=torch.from_numpy(temperature))
        logits = batch_logits()
        raw = logits.clone()
        rows = np.array([5, 4, 3, 2, 1, 0])  # the batch's rows in another order than the requests' slots
        states.apply_temperature(logits, torch.from_numpy(rows), rows)
        entropy = getattr(states, runner_v2_patch.STASH)
        scaled = temperature[rows].tolist() if options.temperature_scaled else None
        torch.testing.assert_close(entropy.double(), entropy64(raw, scaled, options.top_k), rtol=1e-5, atol=1e-5)
        assert not torch.equal(logits, raw)  # V2 went on to divide them
    finally:
        remove_all(runner_v2_patch.PATCHES)
