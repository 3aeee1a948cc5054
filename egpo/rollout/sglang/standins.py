"""Import-time stand-ins that let sglang (0.5.6.post2, 0.5.12) run on a CPU-only machine, without its CUDA stack.

sglang installed with ``--no-deps`` (docs/cpu.md, "sglang on a CPU") lacks three packages its modules import:

* ``sgl_kernel`` (imported unconditionally by a MoE module; its wheel needs CUDA) and ``torchvision`` (PyPI's
  build needs CUDA libraries): inert modules whose every attribute is a placeholder. On a CPU without AMX
  nothing calls into them.
* ``vllm``: on a CPU without AMX, ``sglang.srt.layers.activation`` and ``.layernorm`` end with
  ``from vllm.model_executor.layers.{activation,layernorm} import ...``, replacing their own ``SiluAndMul``,
  ``GeluAndMul``, ``RMSNorm``, ``GemmaRMSNorm`` by vLLM's. The stand-in hands back **sglang's own classes**
  (already defined in the half-imported sglang module), so the model keeps sglang's native implementations;
  ``vllm._custom_ops`` functions raise if called (only CUDA / ROCm paths call them). Any other ``vllm``
  submodule is absent (sglang treats its ImportError as "no vLLM").

They are installed only where they are needed (:func:`cpu_standins_needed`: no CUDA device and no real
``sgl_kernel``), so a GPU deployment never sees them. Every process that imports sglang installs them first:
the process that loads verl's sglang replica, the sglang server, the trainer's rollout adapter, and sglang's
spawned scheduler and detokenizer processes (their entry points, :mod:`egpo.rollout.sglang.process_entries`,
install them when the child unpickles its target, before any sglang module is imported there).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

INERT = ("sgl_kernel", "torchvision")
# the inert torchvision's version: transformers >= 5.12 parses it where sglang >= 0.5.20 imports torchvision
TORCHVISION_VERSION = "0.28.0"
VLLM_LAYER_MODULES = {
    "vllm.model_executor.layers.activation": "sglang.srt.layers.activation",
    "vllm.model_executor.layers.layernorm": "sglang.srt.layers.layernorm",
}
VLLM_PACKAGES = ("vllm", "vllm.model_executor", "vllm.model_executor.layers")
VLLM_CUSTOM_OPS = "vllm._custom_ops"


class _Placeholder:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Placeholder()

    def __getattr__(self, name):
        return _Placeholder()

    def __mro_entries__(self, bases):
        return (object,)


class _InertModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _SglangClassesModule(types.ModuleType):
    """``vllm.model_executor.layers.X``: every name resolves to the class sglang's own module defines."""

    sglang_module: str

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        owner = sys.modules.get(self.sglang_module)
        if owner is None or not hasattr(owner, name):
            raise ImportError(f"egpo's vllm stand-in has no {name!r}: {self.sglang_module} does not define it")
        return getattr(owner, name)


class _CustomOpsModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise RuntimeError(
                f"vllm._custom_ops.{name} was called, but egpo's CPU stand-in for vllm has no kernels; this sglang "
                "code path needs CUDA (or a CPU with AMX and sgl-kernel)"
            )

        return unavailable


def _kind(fullname: str) -> str | None:
    root = fullname.split(".")[0]
    if root in INERT:
        return "inert"
    if fullname in VLLM_PACKAGES:
        return "package"
    if fullname in VLLM_LAYER_MODULES:
        return "sglang_classes"
    if fullname == VLLM_CUSTOM_OPS:
        return "custom_ops"
    return None


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        kind = _kind(fullname)
        if kind is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=kind in ("inert", "package"))

    def create_module(self, spec):
        kind = _kind(spec.name)
        if kind == "inert":
            module = _InertModule(spec.name)
        elif kind == "sglang_classes":
            module = _SglangClassesModule(spec.name)
            module.sglang_module = VLLM_LAYER_MODULES[spec.name]
        elif kind == "custom_ops":
            module = _CustomOpsModule(spec.name)
        else:
            module = types.ModuleType(spec.name)
        if kind in ("inert", "package"):
            module.__path__ = []
        if spec.name == "torchvision":
            module.__version__ = TORCHVISION_VERSION
        return module

    def exec_module(self, module):
        pass


def cpu_standins_needed() -> bool:
    """True on a machine without CUDA where sglang's CUDA kernels (``sgl_kernel``) are not installed."""
    import torch

    if torch.cuda.is_available():
        return False
    finder = next((f for f in sys.meta_path if isinstance(f, _StandInFinder)), None)
    if finder is not None:
        return True
    return importlib.util.find_spec("sgl_kernel") is None


TORCHVISION_GATED = ("AutoImageProcessor",)  # what sglang 0.5.12 imports from transformers at its own import
PLACEHOLDER = "_LazyModule.__getattr__.<locals>.Placeholder"


def _forget_cached_torchvision_check() -> None:
    """transformers caches "is torchvision installed?" (``lru_cache``), and the placeholder class it hands out for a
    name that needed torchvision (``AutoImageProcessor``, whose ``register`` is None); where either happened before the
    stand-in existed (verl touches them at import), sglang 0.5.12's image-processor registration
    (``sglang.srt.configs``) would fail. Both are forgotten, so the names resolve again."""
    module = sys.modules.get("transformers.utils.import_utils")
    for name in ("is_torchvision_available", "is_torchvision_v2_available"):
        check = getattr(module, name, None) if module is not None else None
        if hasattr(check, "cache_clear"):
            check.cache_clear()
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return
    import importlib

    # transformers' top level answers names whose backend it found missing at its import with a placeholder: point
    # them at the real class in its own module, now importable
    for attr in TORCHVISION_GATED:
        value = getattr(transformers, attr, None)
        if isinstance(value, type) and value.__qualname__.endswith(PLACEHOLDER):
            setattr(transformers, attr, getattr(importlib.import_module(value.__module__), attr))


def standins_installed() -> bool:
    """Whether this process's imports of ``sgl_kernel``, ``torchvision`` and ``vllm`` go to the stand-ins (a real
    vLLM cannot be imported in it after that)."""
    return any(isinstance(f, _StandInFinder) for f in sys.meta_path)


def install_standins() -> None:
    """Install the stand-ins unconditionally (idempotent). Production code calls :func:`prepare_sglang_import`."""
    if not any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StandInFinder())
        _forget_cached_torchvision_check()


def prepare_sglang_import() -> bool:
    """Before this process imports sglang: the CPU stand-ins where needed. Returns whether they are active."""
    if not cpu_standins_needed():
        return False
    install_standins()
    return True


# sglang 0.5.12 modules that build small index tensors in pinned host memory (``torch.tensor(..., pin_memory=True)``)
# before a non-blocking copy to the device; a CPU-only torch has no pinned-memory allocator and raises. The
# logits processor does it whenever a prefill returns input log probs (a retracted request's re-prefill, prompt
# log probs), which a GPU never notices.
PINNING_MODULES = ("sglang.srt.layers.logits_processor",)


class _UnpinnedTorch(types.ModuleType):
    """``torch`` for one sglang module on a CPU-only machine: ``torch.tensor`` without ``pin_memory``."""

    def __init__(self, torch_module):
        super().__init__("torch")
        self._torch = torch_module

    def tensor(self, *args, pin_memory=False, **kwargs):
        return self._torch.tensor(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._torch, name)


def unpin_host_tensors() -> None:
    """In a scheduler process on a CPU-only machine: :data:`PINNING_MODULES` build their host tensors unpinned (the
    copy that follows is a CPU-to-CPU no-op). Checked: each module still pins (else this is not needed)."""
    import importlib
    import inspect

    import torch

    for name in PINNING_MODULES:
        module = importlib.import_module(name)
        current = module.__dict__.get("torch")
        if isinstance(current, _UnpinnedTorch):
            continue
        if current is not torch or "pin_memory=True" not in inspect.getsource(module):
            raise RuntimeError(f"{name} no longer pins host tensors through its module-level torch; egpo's CPU "
                               "stand-in for it is out of date")
        module.torch = _UnpinnedTorch(torch)

