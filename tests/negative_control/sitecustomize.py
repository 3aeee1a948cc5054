"""A negative control, loaded by every Python process started with this folder on ``PYTHONPATH`` (Ray's workers and
vLLM's processes inherit it): with ``EGPO_TEST_DROP_WEIGHT_PUSH=1``, verl's vLLM worker extension receives every
pushed bucket and loads none of it, so vLLM keeps the weights it started with (``load_format=dummy``: random).

A test that shows the rollout agreeing with the actor only while the push is loaded uses it: a run where a missed
update could pass would pass here too.
"""

import importlib.abc
import importlib.machinery
import os
import sys

TARGET = "verl.workers.rollout.vllm_rollout.utils"


def _drop_pushed_weights(module) -> None:
    extension = module.vLLMColocateWorkerExtension

    def _update_weights(self, weights, *args, **kwargs):
        print(f"[negative control] dropped a pushed bucket of {len(weights)} tensors", file=sys.stderr, flush=True)

    extension._update_weights = _update_weights


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _drop_pushed_weights(module)

        spec.loader.exec_module = exec_then_patch
        return spec


if os.environ.get("EGPO_TEST_DROP_WEIGHT_PUSH") == "1":
    sys.meta_path.insert(0, _AfterImport())
