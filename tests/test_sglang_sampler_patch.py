"""The patched real ``sglang.srt.layers.sampler.Sampler.forward`` on CPU tensors.

Entropy must equal a float64 reference (full / top-k, raw / temperature-scaled, -inf entries, one-hot rows),
for greedy and sampling batches, and the patch must not change which tokens are sampled.
"""

from types import SimpleNamespace

import pytest
import torch

from egpo.rollout.entropy import EntropyOptions
from egpo.rollout.sglang.versions import SglangPatchTargetError
from sglang_required import import_sglang_sampler

sampler_mod = import_sglang_sampler()
from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402
from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo  # noqa: E402

from egpo.rollout.sglang import sampler_patch  # noqa: E402

V = 64


@pytest.fixture(autouse=True)
def cpu_sampler_environment(monkeypatch):
    args = SimpleNamespace(enable_nan_detection=False, rl_on_policy_target=None, sampling_backend="pytorch",
                           enable_deterministic_inference=False)  # the last one: sglang 0.5.12
    monkeypatch.setattr(sampler_mod, "get_global_server_args", lambda: args)
    monkeypatch.setattr(sampler_mod, "get_tp_group", lambda: SimpleNamespace(device_group=None))
    yield
    sampler_patch.SAMPLER_FORWARD.remove()


def batch_info(temperatures, greedy: bool, top_k=None):
    bs = len(temperatures)
    ks = torch.full((bs,), top_k or V, dtype=torch.int32)
    return SamplingBatchInfo(
        temperatures=torch.tensor(temperatures, dtype=torch.float32).view(-1, 1),
        top_ps=torch.ones(bs),
        top_ks=ks,
        min_ps=torch.zeros(bs),
        is_all_greedy=greedy,
        need_top_p_sampling=False,
        need_top_k_sampling=top_k is not None,
        need_min_p_sampling=False,
        vocab_size=V,
        device="cpu",
    )


def logits_batch():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, V, generator=g) * 3
    x[1, :20] = float("-inf")  # a grammar mask
    x[2] = float("-inf")
    x[2, 7] = 0.0  # one-hot: entropy 0
    x[3, ::2] = float("-inf")
    return x


def reference(x, top_k=0, temperature=None):
    x = x.double()
    if temperature is not None:
        x = x / torch.as_tensor(temperature, dtype=torch.float64).view(-1, 1)
    if top_k:
        x = torch.topk(x, top_k, dim=-1).values
    p = torch.softmax(x, dim=-1)
    logp = torch.log_softmax(x, dim=-1)
    return -(torch.where(p > 0, p * logp, torch.zeros_like(p))).sum(-1)


def run(x, info, seed=1234):
    out = LogitsProcessorOutput(next_token_logits=x.clone())
    torch.manual_seed(seed)
    ids = sampler_mod.Sampler().forward(out, info, False, [0] * len(x), [None] * len(x), torch.arange(len(x)))
    return ids, out


@pytest.mark.parametrize("top_k", [0, 5])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("greedy", [False, True])
def test_entropy_matches_float64_reference(top_k, scaled, greedy):
    x = logits_batch()
    temps = [1.0] * 5 if greedy else [0.7, 1.0, 1.3, 0.5, 2.0]
    sampler_patch.apply_sampler_patch(EntropyOptions(top_k=top_k, temperature_scaled=scaled))
    _, out = run(x, batch_info(temps, greedy))
    got = getattr(out, sampler_patch.ENTROPY_ATTR)
    expected = reference(x, top_k, temps if scaled else None)
    assert got.dtype == torch.float32 and got.shape == (5,)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    assert got[2] == 0  # one-hot row


@pytest.mark.parametrize("greedy, top_k", [(False, None), (False, 8), (True, None)])
def test_sampled_tokens_are_unchanged_by_the_patch(greedy, top_k):
    x = logits_batch()
    temps = [1.0] * 5 if greedy else [0.7, 1.0, 1.3, 0.5, 2.0]
    plain, _ = run(x, batch_info(temps, greedy, top_k))
    sampler_patch.apply_sampler_patch(EntropyOptions())
    patched, out = run(x, batch_info(temps, greedy, top_k))
    assert torch.equal(plain, patched)
    assert hasattr(out, sampler_patch.ENTROPY_ATTR)


def test_patch_is_idempotent_and_updates_options():
    sampler_patch.apply_sampler_patch(EntropyOptions())
    sampler_patch.apply_sampler_patch(EntropyOptions(top_k=3))
    forward = sampler_patch.SAMPLER_FORWARD
    assert forward.applied() and sampler_mod.Sampler.forward is forward.current()
    assert not hasattr(forward.original(), "__egpo_patch__")  # wrapped once, around sglang's
    _, out = run(logits_batch(), batch_info([1.0] * 5, True))
    assert getattr(out, sampler_patch.ENTROPY_ATTR).max() <= torch.log(torch.tensor(3.0)) + 1e-6


def test_guard_fires_on_an_altered_forward(monkeypatch):
    def altered(self, logits_output, sampling_info, return_logprob, top_logprobs_nums, token_ids_logprobs):
        return None

    monkeypatch.setattr(sampler_mod.Sampler, "forward", altered)
    with pytest.raises(SglangPatchTargetError, match="Sampler.forward has parameters"):
        sampler_patch.apply_sampler_patch(EntropyOptions())
    assert sampler_mod.Sampler.forward is altered
