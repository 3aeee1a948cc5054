"""Import-time stand-ins that let sglang 0.5.6.post2's Python modules import on a machine without its CUDA stack.

For the contract tests and ``bench/sampler_patch.py`` only; a real sglang deployment never calls this.

``sgl_kernel`` (imported unconditionally by a MoE module; its wheel needs CUDA) and ``torchvision`` (PyPI's
build needs CUDA libraries) are replaced by modules whose every attribute is an inert placeholder. Nothing
the tests drive calls into them: the sampler runs its ``pytorch`` backend.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("sgl_kernel", "torchvision")


class _Placeholder:
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Placeholder()

    def __getattr__(self, name):
        return _Placeholder()

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def install_standins() -> None:
    """Idempotent."""
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())


def import_sglang_sampler():
    """The real ``sglang.srt.layers.sampler`` module, or a pytest skip when sglang is not installed."""
    import pytest

    pytest.importorskip("sglang", reason="sglang 0.5.6.post2 is installed by .ci/run (pip install --no-deps)")
    install_standins()
    import sglang.srt.layers.sampler as sampler

    return sampler
