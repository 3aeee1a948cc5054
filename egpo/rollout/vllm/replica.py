"""verl's vLLM replica, serving :class:`~egpo.rollout.vllm.server.EntropyvLLMHttpServer`."""

from __future__ import annotations

import ray

from egpo.compat.rollout import serves_the_policy, verl_replica_class

vLLMReplica = verl_replica_class("vllm")

from egpo.rollout.vllm.server import EntropyvLLMHttpServer  # noqa: E402


class EntropyvLLMReplica(vLLMReplica):
    """verl's arguments pass through (0.9.1 adds ``is_teacher_model`` and ``name_suffix``). A reward model's or
    teacher's replica (verl resolves them from the same registry) keeps verl's own server."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if serves_the_policy(self):
            self.server_class = ray.remote(EntropyvLLMHttpServer)
