"""bench/packed_attention.py compares like with like: its block-diagonal causal mask is the one a packed micro-batch
needs (a hand-worked example), and sdpa under it equals attention within each sequence."""

import importlib.util
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent.parent / "bench" / "packed_attention.py"


def bench():
    spec = importlib.util.spec_from_file_location("packed_attention", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_mask_lets_each_position_see_only_its_own_sequences_past():
    mask = bench().block_causal_mask([2, 3])
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [0, 0, 1, 0, 0],
                             [0, 0, 1, 1, 0],
                             [0, 0, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_packed_attention_under_the_mask_is_attention_within_each_sequence():
    module = bench()
    torch.manual_seed(0)
    lengths = [5, 7, 4]
    q, k, v = (torch.randn(1, 2, sum(lengths), 8, dtype=torch.float64) for _ in range(3))
    packed = module.packed(q, k, v, module.block_causal_mask(lengths))
    torch.testing.assert_close(packed, module.per_sequence(q, k, v, lengths), rtol=1e-12, atol=1e-12)
    # and not attention over the whole packed sequence
    assert not torch.allclose(packed, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
