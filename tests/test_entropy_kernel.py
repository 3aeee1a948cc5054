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
        assert not entropy_module._compile_failed, "the compiled kernel fell back to eager"
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
    with pytest.raises(ValueError, match="unknown rollout entropy option"):
        EntropyOptions.from_config({"topk": 5})
    with pytest.raises(ValueError, match="top_k must be an int >= 0"):
        EntropyOptions(top_k=-1)
    with pytest.raises(ValueError, match="2-D"):
        token_entropy(torch.zeros(3))
