"""The bytes autograd saves for the backward pass while a function runs: the one counter of
``bench/verl_update_memory.py`` and ``tests/test_update_memory.py``."""

from __future__ import annotations


def saved_bytes(fn, skip=lambda tensor: False) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``fn`` runs (each held until the end, so that
    a later micro-batch's tensors cannot reuse a freed one's memory and be counted as the same). Tensors ``skip``
    names are left out (it sees a DTensor's local shard, a nested tensor's values)."""
    import torch

    seen, total, held = set(), [0], []

    def pack(tensor):
        inner = tensor.values() if getattr(tensor, "is_nested", False) else tensor
        inner = getattr(inner, "_local_tensor", inner)  # a DTensor's shard
        if skip(inner):
            return tensor
        try:
            storage = inner.untyped_storage()
            key, size = (storage.data_ptr(), storage.nbytes()), storage.nbytes()
        except (RuntimeError, NotImplementedError):  # a wrapper without a storage of its own
            key, size = (id(inner), 0), inner.numel() * inner.element_size()
        if key not in seen and key[0] != 0:
            seen.add(key)
            total[0] += size
            held.append(inner)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return total[0]
