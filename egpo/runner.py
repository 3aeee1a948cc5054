"""egpo's task runner: verl's, building egpo's trainer (and, where a run needs them, egpo's workers).

It lives in its own module, not in ``egpo.main``: ``python -m egpo.main`` runs that module as ``__main__``, whose
classes Ray pickles by value, and with them a by-value copy of verl's ``TaskRunner.run`` whose globals no longer
are verl's module (on verl 0.9.1 the plain runner class is not reachable by its module path, which holds the Ray
actor class). Imported from here, Ray sends a reference and the runner's process imports verl's own ``run``.
"""

from __future__ import annotations

import ray

from egpo.compat.entry import verl_entry
from egpo.console import fold_verls_dumps

ENTRY = verl_entry()  # verl's task runner for the installed version (egpo.compat.entry), checked at import


class EgpoTaskRunner(ENTRY.base):
    """verl's TaskRunner building :class:`egpo.trainer.ray_trainer.EgpoRayPPOTrainer` instead of RayPPOTrainer.

    ``TaskRunner.run`` constructs the trainer by its module's global name ``RayPPOTrainer``; this runner lives in
    its own Ray actor process, where that name is pointed at egpo's subclass before verl's ``run`` executes.
    """

    def trainer_class(self) -> type:
        from egpo.trainer.ray_trainer import EgpoRayPPOTrainer  # registers the estimator when it is built

        return EgpoRayPPOTrainer

    @staticmethod
    def kept_files(config) -> tuple:
        """(the file that keeps the run's configuration, the file that keeps its metrics), or (None, None)."""
        from egpo.runs.main_dir import run_directory
        from egpo.runs.state import CONFIG, METRICS_FILE

        where = run_directory(config)
        return (where / CONFIG, where / METRICS_FILE) if where is not None else (None, None)

    def finished(self, config, seconds: float) -> None:
        from egpo.runs.main_dir import end_runner_output

        end_runner_output(config, seconds)  # the driver's closing summary follows it

    def run(self, config):
        import time

        started = time.monotonic()
        ENTRY.install_trainer(self.trainer_class())
        fold_verls_dumps(*self.kept_files(config))  # the run directory holds them (egpo.console)
        if config.trainer.get("device", "cuda") == "cpu":
            from egpo.cpu.padding import use_torch_padding

            use_torch_padding()  # the trainer unpads batches for verl 0.7.1's engine workers
        result = ENTRY.task_runner.run(self, config)
        self.finished(config, time.monotonic() - started)
        return result

    def add_actor_rollout_worker(self, config):
        """verl's actor/rollout worker, replaced by egpo's where a run needs one (:mod:`egpo.compat.workers`): the CPU
        worker on ``trainer.device=cpu``, the probe worker with ``egpo.probe.enable``."""
        from verl.trainer.ppo.ray_trainer import Role

        from egpo.compat.workers import replacement_worker, worker_family
        from egpo.probe.settings import WORKER_KEY, ProbeSettings

        actor_rollout_cls, worker_group_cls = super().add_actor_rollout_worker(config)
        on_cpu = config.trainer.get("device", "cuda") == "cpu"
        probe = ProbeSettings.from_config(config.actor_rollout_ref.get(WORKER_KEY, None)).enable
        worker_cls = replacement_worker(actor_rollout_cls, on_cpu, probe, worker_family(config))
        if worker_cls is None:
            return actor_rollout_cls, worker_group_cls
        for role in (Role.ActorRollout, Role.ActorRolloutRef):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(worker_cls)
        return worker_cls, worker_group_cls


def launch(config, runner_class: type = EgpoTaskRunner) -> None:
    """The one launch of every entry point that runs verl (``egpo.main``'s training, ``egpo.generate``'s runner):
    egpo's estimator registered in the driver, then verl's ``run_ppo`` with ``runner_class`` as its task runner, a Ray
    actor kept on the driver's node; a vLLM CPU engine's shared-memory segments of this run removed when it ends."""
    from verl.trainer import main_ppo

    from egpo.advantage.registry import register as register_estimator
    from egpo.cpu.vllm_rollout import SegmentsOfThisRun
    from egpo.trainer.placement import OnDriverNode

    register_estimator()
    with SegmentsOfThisRun(config):
        main_ppo.run_ppo(config, task_runner_class=OnDriverNode(ray.remote(num_cpus=1)(runner_class)))

