"""verl's FSDP actor/rollout worker with the entropy probe installed after ``init_model`` (when enabled)."""

from __future__ import annotations

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.fsdp_workers import AsyncActorRolloutRefWorker

from egpo.probe.actor_probe import install_actor_probe


class ProbeActorRolloutRefWorker(AsyncActorRolloutRefWorker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        install_actor_probe(self)
