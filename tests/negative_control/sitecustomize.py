"""A negative control, loaded by every Python process started with this folder on ``PYTHONPATH`` (Ray's workers and
vLLM's processes inherit it): with ``EGPO_TEST_DROP_WEIGHT_PUSH=N``, verl's vLLM worker extension receives the N-th
weight push of the run and every later one but loads none of their buckets, so vLLM keeps sampling from the weights
of the push before (push 1 is the first sync, before step 1; push k + 1 follows step k's update).

A test that shows the rollout agreeing with the actor while the pushes are loaded, and parting from it at the step
whose push was dropped, uses it: a missed update cannot pass unseen.
"""

import importlib.abc
import importlib.machinery
import os
import sys

TARGET = "verl.workers.rollout.vllm_rollout.utils"


def _drop_pushed_weights(module) -> None:
    extension = module.vLLMColocateWorkerExtension
    first_dropped = int(os.environ["EGPO_TEST_DROP_WEIGHT_PUSH"])
    receive, load = extension.update_weights_from_ipc, extension._update_weights
    pushes = [0]

    def update_weights_from_ipc(self, *args, **kwargs):
        pushes[0] += 1
        return receive(self, *args, **kwargs)

    def _update_weights(self, weights, *args, **kwargs):
        if pushes[0] < first_dropped:
            return load(self, weights, *args, **kwargs)
        print(f"[negative control] push {pushes[0]}: dropped a bucket of {len(weights)} tensors", file=sys.stderr,
              flush=True)

    extension.update_weights_from_ipc = update_weights_from_ipc
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


if os.environ.get("EGPO_TEST_DROP_WEIGHT_PUSH"):
    sys.meta_path.insert(0, _AfterImport())
