"""What egpo runs on each verl stack, and the start-up refusal (before Ray) of what a stack cannot run yet.

On verl 0.9.1, training with sglang 0.5.12 as the rollout is refused with the stack that runs it: egpo's patches run
on its engine (tested), but verl 0.9.1's sglang replica and weight push are not proven in a training run yet.
egpo's CPU backend, the entropy probe and multi-turn rollout entropy run on both (:mod:`egpo.compat.workers`,
:mod:`egpo.compat.rollout`).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from egpo.compat.versions import INSTALL, verl_version
from egpo.settings import EgpoConfigError

OLD_STACK = f"the verl 0.7.1 stack ({INSTALL['0.7.1']}; README, 'Install')"


def stack_problems(config: DictConfig, version: str) -> list[str]:
    if version == "0.7.1":
        return []
    problems = []
    if OmegaConf.select(config, "trainer.use_v1", default=False):
        problems.append("trainer.use_v1=true selects verl's TransferQueue trainer, whose advantage step never sees "
                        "the entropy or the responses EGPO needs; set ++trainer.use_v1=false (egpo's configs do)")
    if OmegaConf.select(config, "actor_rollout_ref.rollout.name", default=None, throw_on_missing=False) == "sglang":
        problems.append(f"actor_rollout_ref.rollout.name=sglang: egpo's patches run on verl {version}'s sglang 0.5.12 "
                        "engine, but a training run with it (verl's sglang replica, the weight push) is not proven yet; "
                        f"use {OLD_STACK} with sglang, or actor_rollout_ref.rollout.name=vllm with "
                        "++algorithm.entropy_source=actor")
    return problems


def check_stack(config: DictConfig) -> str:
    """The installed verl is a tested one, and this config is one its egpo runs. Returns the verl version."""
    version = verl_version()
    problems = stack_problems(config, version)
    if problems:
        raise EgpoConfigError(f"on verl {version}: " + "; ".join(problems) + ". Nothing was started.")
    return version
