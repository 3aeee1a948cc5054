"""egpo from a verl user's own entry point (README, 'Your own entry point'): verl's own ``ppo_trainer`` config with
egpo's keys as overrides, ``egpo.preflight.prepare.prepare_config`` before Ray, and the classes that entry point builds."""

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from conftest import VERL


def test_verls_own_config_with_egpos_overrides_is_prepared(demo):
    from egpo.preflight.prepare import prepare_config
    from egpo.rollout.agent_loop import MANAGER_PATH

    overrides = ["algorithm.adv_estimator=egpo", "++algorithm.entropy_source=rollout", "++algorithm.egpo_lambda=0.3",
                 "++algorithm.egpo_alpha=2.0", f"actor_rollout_ref.model.path={demo / 'model'}",
                 "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.model.use_remove_padding=true",
                 f"data.train_files={demo / 'data' / 'train.parquet'}", f"data.val_files={demo / 'data' / 'val.parquet'}",
                 "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                 "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                 "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "trainer.logger=[console]",
                 *(["++trainer.use_v1=false"] if VERL == "0.9.1" else [])]
    with initialize_config_module(config_module="verl.trainer.config", version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    config = prepare_config(config)
    assert OmegaConf.select(config, "actor_rollout_ref.rollout.agent.agent_loop_manager_class") == MANAGER_PATH
    assert config.algorithm.cot_start_token_id is not None and config.algorithm.cot_end_token_id is not None
    assert config.actor_rollout_ref.actor.calculate_entropy is False  # the update-time entropy: never egpo's
    assert config.actor_rollout_ref.actor.entropy_from_logits_with_chunking is True


def test_the_classes_an_own_entry_point_builds():
    import egpo
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from egpo.advantage.registry import ESTIMATOR_NAME
    from egpo.compat.entry import verl_entry
    from egpo.runner import EgpoTaskRunner
    from egpo.trainer.ray_trainer import EgpoRayPPOTrainer

    assert issubclass(EgpoRayPPOTrainer, RayPPOTrainer)
    assert issubclass(EgpoTaskRunner, verl_entry().base)
    egpo.register()
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    assert get_adv_estimator_fn(ESTIMATOR_NAME) is not None
