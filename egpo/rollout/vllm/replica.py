"""verl's vLLM replica, serving :class:`~egpo.rollout.vllm.server.EntropyvLLMHttpServer`."""

from __future__ import annotations

import ray

from egpo.compat.rollout import verl_replica_class

vLLMReplica = verl_replica_class("vllm")

from egpo.rollout.vllm.server import EntropyvLLMHttpServer  # noqa: E402


class EntropyvLLMReplica(vLLMReplica):
    """verl's arguments pass through (0.9.1 adds ``is_teacher_model`` and ``name_suffix``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(EntropyvLLMHttpServer)
