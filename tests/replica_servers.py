"""Which server class an egpo replica serves, built with verl's real replica ``__init__`` (the reward-model and
teacher tests of tests/test_sglang_server.py and tests/test_vllm_server.py)."""

from __future__ import annotations

import inspect


def served_class(replica_cls, rollout_name: str, **kwargs):
    """The class the replica's ``server_class`` (a Ray actor class) was made from."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="egpo.config", version_base=None):
        rollout = compose(config_name="egpo_trainer",
                          overrides=[f"actor_rollout_ref.rollout.name={rollout_name}",
                                     "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]).actor_rollout_ref.rollout
    return replica_cls(0, rollout, None, 1, **kwargs).server_class.__ray_metadata__.modified_class


def check_side_models_keep_verls_server(replica_cls, rollout_name: str, ours, verls) -> None:
    """The policy's replica serves egpo's server; a reward model's and (verl 0.9.1) a teacher's keep verl's."""
    assert issubclass(served_class(replica_cls, rollout_name), ours)  # Ray's actor class derives from the given one
    reward_model = served_class(replica_cls, rollout_name, is_reward_model=True)
    assert issubclass(reward_model, verls) and not issubclass(reward_model, ours)
    if "is_teacher_model" in inspect.signature(replica_cls.__mro__[1].__init__).parameters:
        assert not issubclass(served_class(replica_cls, rollout_name, is_teacher_model=True), ours)
