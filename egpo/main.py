"""``python -m egpo.main``: verl's PPO entry point with egpo's trainer, estimator and start-up checks.

    python -m egpo.main algorithm.adv_estimator=egpo algorithm.entropy_source=rollout ...
"""

from __future__ import annotations

import hydra
import ray
from omegaconf import DictConfig

from verl.trainer import main_ppo

import egpo  # noqa: F401  (registers the estimator in the driver)
from egpo.trainer.config import EgpoSettings, resolve_think_token_ids


def prepare_config(config: DictConfig) -> DictConfig:
    """Start-up checks, before Ray or any worker starts. Fills the think-token ids from the tokenizer."""
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.utils.device import auto_set_device

    settings = EgpoSettings.from_algorithm(config.algorithm)
    auto_set_device(config)
    config = migrate_legacy_reward_impl(config)
    if settings.enabled:
        from verl.utils import hf_tokenizer
        from verl.utils.fs import copy_to_local

        path = copy_to_local(config.actor_rollout_ref.model.path, use_shm=False)
        tokenizer = hf_tokenizer(path, trust_remote_code=config.data.get("trust_remote_code", False))
        resolve_think_token_ids(config, tokenizer)
    return config


class EgpoTaskRunner(main_ppo.TaskRunner):
    """verl's TaskRunner building :class:`egpo.trainer.ray_trainer.EgpoRayPPOTrainer` instead of RayPPOTrainer.

    ``TaskRunner.run`` constructs the trainer by the module-level name ``RayPPOTrainer``; this runner lives in
    its own Ray actor process, where that name is pointed at egpo's subclass before verl's ``run`` executes.
    """

    def run(self, config):
        import egpo  # noqa: F401  (registers the estimator in the runner's process)
        from egpo.trainer.ray_trainer import EgpoRayPPOTrainer

        if "RayPPOTrainer" not in main_ppo.TaskRunner.run.__code__.co_names:
            raise RuntimeError(
                "verl's TaskRunner.run no longer builds the trainer by the name RayPPOTrainer (verl 0.7.1 does); "
                "egpo cannot install its trainer. Pin verl==0.7.1 or update egpo.main."
            )
        main_ppo.RayPPOTrainer = EgpoRayPPOTrainer
        return super().run(config)


def run(config: DictConfig) -> None:
    config = prepare_config(config)
    main_ppo.run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(EgpoTaskRunner))


@hydra.main(config_path="config", config_name="egpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    main()
