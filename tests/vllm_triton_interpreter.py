"""Test aid, not a supported setup: vLLM's Model Runner V2 on a CPU, its Triton kernels run by Triton's interpreter.

V2 needs Triton, and vLLM's CPU build counts Triton as present only with a ``cpu`` backend (triton-cpu, which PyPI
does not publish). Upstream ``triton`` installed beside vLLM (``.ci/run``: ``--target``, on ``PYTHONPATH`` for this
run only) with ``TRITON_INTERPRET=1`` runs every ``@triton.jit`` kernel in numpy on CPU tensors; an inert ``cpu``
entry in Triton's backend table lets vLLM see it. Triton's interpreter cannot run vLLM's top-k/top-p kernel, so that
one step takes vLLM's own torch implementation. Call :func:`install` before vLLM is imported.
"""

from __future__ import annotations

import os


def install() -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    class InterpreterDriver(DriverBase):
        @classmethod
        def is_active(cls):
            return True

    backends.setdefault("cpu", Backend(compiler=BaseBackend, driver=InterpreterDriver))


def route_top_k_top_p_to_torch() -> None:
    """After vLLM is imported: its top-k/top-p step in torch (the interpreter cannot run that kernel)."""
    from vllm.v1.sample.ops import topk_topp_sampler

    topk_topp_sampler.HAS_TRITON = False
