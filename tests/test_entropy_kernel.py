"""The one entropy function against a float64 reference, for every option and the -inf traps."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import egpo.rollout.entropy as entropy_module
from egpo.rollout.entropy import EntropyOptions, token_entropy


def reference(logits, top_k=0, temperature=None):
    x = logits.double()
    if top_k:
        x = torch.topk(x, min(top_k, x.shape[-1]), dim=-1).values
    if temperature is not None:
        t = torch.as_tensor(temperature, dtype=torch.float64)
        x = x / (t if t.dim() == 0 else t[:, None])
    p = torch.softmax(x, dim=-1)
    return -torch.special.xlogy(p, p).sum(-1)


def logits_with_traps(rows=16, vocab=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g) * 3
    x[1, :200] = float("-inf")  # grammar-masked row
    x[2] = float("-inf")
    x[2, 7] = 0.0  # one-hot
    x[3] += 40.0  # large offset (cancellation trap for the logsumexp form)
    x[4, :] = x[4, 0]  # uniform
    return x


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("top_k", [0, 20])
@pytest.mark.parametrize("temperature", [None, 0.7, "per-row"])
def test_matches_float64(compiled, top_k, temperature):
    x = logits_with_traps()
    if temperature == "per-row":
        temperature = torch.linspace(0.3, 1.5, x.shape[0])
    got = token_entropy(x, top_k=top_k, temperature=temperature, compiled=compiled)
    if compiled:
        assert entropy_module.kernel_status()["compiled"], "the compiled kernel fell back to eager"
    ref = reference(x, top_k, temperature)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_exact_values():
    x = logits_with_traps()
    h = token_entropy(x)
    assert h[2].item() == 0.0  # one-hot: exactly 0
    assert math.isclose(h[4].item(), math.log(1000), rel_tol=1e-6)  # uniform: log V
    assert torch.isfinite(h).all()


def test_all_minus_inf_row_is_nan_not_a_crash():
    x = torch.zeros(3, 10)
    x[1] = float("-inf")
    h = token_entropy(x)
    assert math.isnan(h[1].item()) and torch.isfinite(h[[0, 2]]).all()


def test_top_k_with_fewer_finite_entries_than_k():
    x = torch.full((2, 100), float("-inf"))
    x[0, :3] = torch.tensor([1.0, 2.0, 3.0])
    x[1, 0] = 5.0
    h = token_entropy(x, top_k=20)
    torch.testing.assert_close(h.double(), reference(x, 20), rtol=1e-6, atol=1e-7)
    assert h[1].item() == 0.0


def test_bf16_input():
    x = logits_with_traps().bfloat16()
    torch.testing.assert_close(token_entropy(x).double(), reference(x.float()), rtol=1e-5, atol=1e-5)


def test_row_blocks_give_the_same_values():
    x = torch.randn(37, 513)
    whole = token_entropy(x)
    blocked = token_entropy(x, max_block_bytes=4 * 3 * 513 * 5)  # 5 rows per block
    assert torch.equal(whole, blocked)


def test_greedy_rows_still_get_entropy():
    x = torch.randn(2, 50)
    h = token_entropy(x, temperature=torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(h.double(), reference(x), rtol=1e-5, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(2, 300), st.integers(0, 10), st.floats(-50, 50), st.integers(0, 2**31))
def test_bounds(rows, vocab, k, offset, seed):
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 5 + offset
    h = token_entropy(x, top_k=k)
    bound = math.log(min(k, vocab) if k else vocab)
    assert (h >= -1e-6).all() and (h <= bound + 1e-5).all()


def test_options_validate():
    assert EntropyOptions.from_config({"top_k": 5}) == EntropyOptions(top_k=5)
    assert EntropyOptions.from_config(None) == EntropyOptions()
    with pytest.raises(ValueError, match=r"unknown key actor_rollout_ref.rollout.custom.entropy.topk.*top_k"):
        EntropyOptions.from_config({"topk": 5})
    with pytest.raises(ValueError, match="top_k must be an int >= 0"):
        EntropyOptions(top_k=-1)
    with pytest.raises(ValueError, match="2-D"):
        token_entropy(torch.zeros(3))


@pytest.fixture
def fresh_kernel(monkeypatch):
    """This process's kernel state, reset for the test and restored after it."""
    monkeypatch.setattr(entropy_module, "_kernel", {"compiled": None, "fallback_reason": None})
    return entropy_module


def test_fallback_says_once_and_stays_fast(fresh_kernel, monkeypatch, capsys):
    """A compiler failure: the eager kernel takes over, says so once on stderr, and runs a 256-row batch at
    V=151936 in a few blocks (not 9-row blocks: hundreds of launches per decode step) with the same values."""
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    blocks = []
    original = fresh_kernel._entropy_block
    monkeypatch.setattr(fresh_kernel, "_entropy_block", lambda x, t: blocks.append(x.shape[0]) or original(x, t))
    meta = torch.empty(256, 151936, device="meta")  # shapes only: the block plan on an accelerator-sized input
    plan = fresh_kernel.FALLBACK_BLOCK_BYTES // (4 * fresh_kernel.TEMPORARIES * meta.shape[1])
    assert plan >= 128  # a 256-row decode batch in at most two blocks
    x = logits_with_traps(rows=40, vocab=2000)
    for _ in range(3):
        got = token_entropy(x, compiled=True, max_block_bytes=4 * 2 * 2000 * 8)  # 8 rows a block on the CPU
        torch.testing.assert_close(got.double(), reference(x), rtol=1e-5, atol=1e-5)
    err = capsys.readouterr().err
    assert err.count("[egpo] the compiled entropy kernel is unavailable") == 1 and "no compiler here" in err
    assert fresh_kernel.kernel_status() == {"compiled": False, "fallback_reason": "torch.compile: RuntimeError: no compiler here"}
    assert blocks == [8, 8, 8, 8, 8] * 3  # the CPU keeps its own block budget


def test_fallback_blocks_on_an_accelerator_use_the_larger_budget(fresh_kernel, monkeypatch):
    fresh_kernel._kernel["fallback_reason"] = "test"
    blocks = []
    original = fresh_kernel._entropy_block
    monkeypatch.setattr(fresh_kernel, "_entropy_block", lambda x, t: blocks.append(x.shape[0]) or original(x, t))

    class Logits(torch.Tensor):  # a CPU tensor that reports an accelerator device, to read the block plan
        @property
        def device(self):
            return torch.device("cuda", 0)

    x = logits_with_traps(rows=300, vocab=151936 // 64).as_subclass(Logits)
    token_entropy(x, compiled=True)
    rows = fresh_kernel.FALLBACK_BLOCK_BYTES // (4 * fresh_kernel.TEMPORARIES * x.shape[1])
    assert blocks == ([300] if rows >= 300 else [rows] * (300 // rows) + ([300 % rows] if 300 % rows else []))
    assert len(blocks) == 1


def test_warm_up_compiles_before_the_first_call(fresh_kernel):
    """warm_compiled_kernel at engine start: the first real batches (any size, raw or scaled as warmed) compile
    nothing more."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    status = fresh_kernel.warm_compiled_kernel(96, "cpu", temperature_scaled=True)
    assert status == {"compiled": True, "fallback_reason": None}
    compiled = counters["stats"]["unique_graphs"]
    for rows in (1, 3, 17, 64, 1, 2):
        x = torch.randn(rows, 96)
        for t in (torch.full((rows,), 0.7), None):  # scaled, and raw (vLLM's all-greedy batch passes no temperature)
            got = token_entropy(x, temperature=t, compiled=True)
            torch.testing.assert_close(got.double(), reference(x, temperature=t), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == compiled
    assert fresh_kernel.kernel_status() == {"compiled": True, "fallback_reason": None}
