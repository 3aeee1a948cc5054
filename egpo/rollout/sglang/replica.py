"""verl's sglang replica, serving :class:`~egpo.rollout.sglang.server.EntropySGLangHttpServer`."""

from __future__ import annotations

import ray
from verl.workers.rollout.replica import get_rollout_replica_class

from egpo.rollout.sglang.standins import prepare_sglang_import

prepare_sglang_import()  # CPU machines only: before this process imports sglang

# verl prepares sglang's import (environment, a vllm stand-in) in its loader: go through it first
SGLangReplica = get_rollout_replica_class("sglang")

from egpo.rollout.sglang.server import EntropySGLangHttpServer  # noqa: E402


class EntropySGLangReplica(SGLangReplica):
    def __init__(self, replica_rank, config, model_config, gpus_per_node: int = 8, is_reward_model: bool = False):
        super().__init__(replica_rank, config, model_config, gpus_per_node, is_reward_model)
        self.server_class = ray.remote(EntropySGLangHttpServer)
