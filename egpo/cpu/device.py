"""The device module verl's ``get_torch_device()`` returns on the ``cpu`` platform: ``torch.cpu`` plus what verl
calls on an accelerator module and ``torch.cpu`` lacks (memory statistics from :mod:`egpo.cpu.memory`, RNG state,
device selection as no-ops)."""

from __future__ import annotations

import types

import torch

from egpo.cpu.memory import CPU_MEMORY_FUNCTIONS

_module = None

NO_OPS = ("set_device", "set_per_process_memory_fraction", "ipc_collect", "synchronize")


def cpu_device_module() -> types.ModuleType:
    global _module
    if _module is None:
        module = types.ModuleType("egpo_cpu_device", "torch.cpu with the accelerator-module functions verl calls")
        module.__dict__.update({k: v for k, v in vars(torch.cpu).items() if not k.startswith("__")})
        module.__dict__.update(CPU_MEMORY_FUNCTIONS)
        for name in NO_OPS:
            setattr(module, name, lambda *a, **k: None)
        module.current_device = lambda: "cpu"
        module.device_count = lambda: 1
        module.is_available = lambda: True
        module.get_device_name = lambda *a, **k: "cpu"
        module.manual_seed = torch.manual_seed
        module.manual_seed_all = torch.manual_seed
        module.get_rng_state = lambda *a, **k: torch.get_rng_state()
        module.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
        _module = module
    return _module
