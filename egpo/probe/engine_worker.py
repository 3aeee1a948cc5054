"""verl's engine-worker actor/rollout worker (verl 0.9.1) with the entropy probe: its actor is
:class:`egpo.probe.engine_probe.ProbeTrainingWorker` (verl builds it from ``actor_worker_cls``), given a probe
after ``init_model`` when ``egpo.probe.enable``."""

from __future__ import annotations

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from egpo.probe.engine_probe import ProbeTrainingWorker, install_engine_probe


class ProbeEngineActorRolloutRefWorker(ActorRolloutRefWorker):
    actor_worker_cls = ProbeTrainingWorker

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        install_engine_probe(self)
