"""verl's sglang replica, serving :class:`~egpo.rollout.sglang.server.EntropySGLangHttpServer`."""

from __future__ import annotations

import ray

from egpo.compat.rollout import serves_the_policy, verl_replica_class

from egpo.rollout.sglang.standins import prepare_sglang_import

prepare_sglang_import()  # CPU machines only: before this process imports sglang

# verl prepares sglang's import (environment, a vllm stand-in) in its loader: go through it first
SGLangReplica = verl_replica_class("sglang")

from egpo.rollout.sglang.server import EntropySGLangHttpServer  # noqa: E402


class EntropySGLangReplica(SGLangReplica):
    """verl's arguments pass through (0.9.1 adds ``is_teacher_model`` and ``name_suffix``). A reward model's or
    teacher's replica (verl resolves them from the same registry) keeps verl's own server."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if serves_the_policy(self):
            self.server_class = ray.remote(EntropySGLangHttpServer)
