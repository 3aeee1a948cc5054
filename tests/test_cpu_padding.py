"""verl 0.7.1's remove-padding helpers on a machine without flash-attn (egpo.cpu.padding): verl's own pure-torch
copies, behind a shape check that names the version and target when verl's helper changes."""

import pytest
import torch

from conftest import VERL
from egpo.cpu.padding import TARGET, PaddingPatchTargetError, use_torch_padding

pytestmark = pytest.mark.skipif(VERL != "0.7.1", reason="verl 0.9.1 falls back to pure torch itself")


def test_verls_padding_helpers_round_trip_on_the_cpu(monkeypatch):
    from verl.utils import attention_utils

    monkeypatch.setattr(attention_utils, "_get_attention_functions", attention_utils._get_attention_functions)
    with pytest.raises(ModuleNotFoundError, match="flash_attn"):  # the premise: verl's own path needs flash-attn
        attention_utils.unpad_input(torch.zeros(1, 2, 1), torch.ones(1, 2, dtype=torch.long))
    assert use_torch_padding() and use_torch_padding()  # idempotent
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    x = torch.arange(8.0).reshape(2, 4, 1)
    packed, indices, cu_seqlens, max_len, *_ = attention_utils.unpad_input(x, mask)
    assert packed.flatten().tolist() == [0.0, 1.0, 4.0, 5.0, 6.0] and cu_seqlens.tolist() == [0, 2, 5] and max_len == 3
    restored = attention_utils.pad_input(packed, indices, 2, 4)
    assert torch.equal(restored, x * mask.unsqueeze(-1))


def test_a_changed_helper_is_refused_naming_version_and_target(monkeypatch):
    from verl.utils import attention_utils

    monkeypatch.setattr(attention_utils, "_get_attention_functions", lambda device: None)
    with pytest.raises(PaddingPatchTargetError, match=f"verl 0.7.1: {TARGET}"):
        use_torch_padding()
