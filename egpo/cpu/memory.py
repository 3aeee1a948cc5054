"""``torch.cpu`` memory functions that verl's memory utilities call on the accelerator module.

verl calls ``get_torch_device().memory_reserved()`` and friends (``verl/utils/memory_utils.py``) on whatever
device module is active; on a CPU-only machine that is ``torch.cpu``, which has none of them. The functions
installed here report the process's resident set size, so verl's memory logs stay meaningful. Only names
that ``torch.cpu`` lacks are added; anything a future torch provides itself is left alone.
"""

from __future__ import annotations

import psutil
import torch

_peak_rss = 0


def _rss() -> int:
    global _peak_rss
    rss = psutil.Process().memory_info().rss
    _peak_rss = max(_peak_rss, rss)
    return rss


def _peak() -> int:
    _rss()
    return _peak_rss


def _reset_peak(*_args, **_kwargs) -> None:
    global _peak_rss
    _peak_rss = 0


def _mem_get_info(*_args, **_kwargs) -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return vm.available, vm.total


CPU_MEMORY_FUNCTIONS = {
    "memory_allocated": lambda *a, **k: _rss(),
    "memory_reserved": lambda *a, **k: _rss(),
    "max_memory_allocated": lambda *a, **k: _peak(),
    "max_memory_reserved": lambda *a, **k: _peak(),
    "reset_peak_memory_stats": _reset_peak,
    "empty_cache": lambda *a, **k: None,
    "mem_get_info": _mem_get_info,
}


def install_cpu_memory_stats() -> list[str]:
    """Add the missing memory functions to ``torch.cpu``; returns the names added (idempotent)."""
    added = []
    for name, fn in CPU_MEMORY_FUNCTIONS.items():
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, fn)
            added.append(name)
    return added
