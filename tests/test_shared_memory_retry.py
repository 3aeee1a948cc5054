"""A CPU trainer worker's weight push to sglang registers each tensor's segment with torch's shared-memory manager,
which has one second to answer (egpo/cpu/sglang_rollout.py): a registration that timed out is made again, any other
error is not, and the patched method still shares a real tensor by file name."""

import pytest
import torch

from egpo.cpu import sglang_rollout


def test_a_timed_out_registration_is_made_again_and_nothing_else_is(monkeypatch):
    import time

    pauses = []
    monkeypatch.setattr(time, "sleep", pauses.append)
    calls = []

    def flaky(storage, *args, **kwargs):
        calls.append(storage)
        if len(calls) < 3:
            raise RuntimeError("Shared memory manager connection has timed out")
        return ("/torch_1_2", 64)

    assert sglang_rollout._share_filename_again(flaky, "s") == ("/torch_1_2", 64)
    assert calls == ["s", "s", "s"] and pauses == [0.1, 0.2]

    def broken(storage, *args, **kwargs):
        calls.append(storage)
        raise RuntimeError("unable to open shared memory object")

    calls.clear()
    with pytest.raises(RuntimeError, match="unable to open"):
        sglang_rollout._share_filename_again(broken, "s")
    assert len(calls) == 1

    def never(storage, *args, **kwargs):
        calls.append(storage)
        raise RuntimeError("Shared memory manager connection has timed out")

    calls.clear()
    with pytest.raises(RuntimeError, match="timed out"):
        sglang_rollout._share_filename_again(never, "s")
    assert len(calls) == sglang_rollout.SHARE_RETRIES + 1


def test_the_patched_method_shares_a_real_tensor_by_file_name():
    import torch.multiprocessing as mp

    patch = sglang_rollout.share_filename_patch()
    before = mp.get_sharing_strategy()
    patch.apply()
    try:
        mp.set_sharing_strategy("file_system")
        tensor = torch.arange(16, dtype=torch.float32)
        handle = tensor.untyped_storage()._share_filename_cpu_()
        assert patch.applied() and len(handle) == 3 and tensor.is_shared()
        assert torch.equal(tensor, torch.arange(16, dtype=torch.float32))
    finally:
        patch.remove()
        mp.set_sharing_strategy(before)
    assert not patch.applied()
