"""``python -m egpo.main``: verl's PPO entry point with egpo's trainer, estimator and start-up checks.

    python -m egpo.main algorithm.adv_estimator=egpo algorithm.entropy_source=rollout ...
"""

from __future__ import annotations

import hydra
import ray
from omegaconf import DictConfig, OmegaConf

from verl.trainer import main_ppo

from egpo.advantage.registry import register as register_estimator
from egpo.compat.stack import check_stack
from egpo.preflight.paths import resolve_local_paths
from egpo.runner import EgpoTaskRunner
from egpo.settings import EgpoSettings
from egpo.trainer.actor_entropy import prepare_actor_entropy
from egpo.trainer.config import load_tokenizer, resolve_think_token_ids
from egpo.trainer.key_check import check_unknown_keys
from egpo.trainer.startup_checks import (
    check_cpu_backend,
    check_ray_cluster_settings,
    check_rollout_entropy_path,
    check_token_selection,
    select_agent_loop_manager,
)


def build_demo_if_missing(config: DictConfig) -> None:
    """Recipes with an ``egpo_demo`` node (recipes/cpu_smoke.yaml) get the tiny model and task built on first use."""
    demo = config.get("egpo_demo", None)
    if demo and demo.get("build_if_missing", False):
        from egpo.demo.build import build

        build(demo.out, seed=int(demo.get("seed", 0)), warm=bool(demo.get("warm", False)))


def pass_probe_settings_to_workers(config: DictConfig) -> None:
    """``egpo.probe.*`` (validated here) travels to the actor workers inside ``actor_rollout_ref``."""
    from omegaconf import open_dict

    from egpo.probe.settings import WORKER_KEY, ProbeSettings

    node = OmegaConf.select(config, "egpo.probe", default=None)
    if ProbeSettings.from_config(node).enable and config.actor_rollout_ref.actor.get("strategy", "fsdp") == "megatron":
        from egpo.settings import EgpoConfigError

        raise EgpoConfigError(
            "egpo.probe.enable=true hooks verl's FSDP actor, but actor_rollout_ref.actor.strategy=megatron; set "
            "++egpo.probe.enable=false (or train with actor_rollout_ref.actor.strategy=fsdp2)"
        )
    if ProbeSettings.from_config(node).enable:
        from egpo.compat.versions import verl_version
        from egpo.compat.workers import PROBE_WORKER, worker_family

        family = worker_family(config)
        if (verl_version(), family) not in PROBE_WORKER:
            from egpo.settings import EgpoConfigError

            raise EgpoConfigError(f"egpo.probe.enable=true hooks no verl {verl_version()} {family} worker; set "
                                  "++egpo.probe.enable=false (or trainer.use_legacy_worker_impl=auto)")
    with open_dict(config.actor_rollout_ref):
        config.actor_rollout_ref[WORKER_KEY] = node if node is not None else {"enable": False}


def prepare_config(config: DictConfig, preflight: bool = True) -> DictConfig:
    """Start-up checks, before Ray or any worker starts. Fills the think-token ids from the tokenizer.

    ``preflight``: also the cheap preflight checks (data files, loggers, batch arithmetic, the run's generation
    budget; :func:`egpo.preflight.startup_preflight`); ``python -m egpo.preflight`` runs them itself, all of them.
    """
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.utils.device import auto_set_device

    check_unknown_keys(config)
    check_stack(config)
    rollout_name = OmegaConf.select(config, "actor_rollout_ref.rollout.name", default=None, throw_on_missing=False)
    settings = EgpoSettings.from_algorithm(config.algorithm, rollout_name=rollout_name)
    build_demo_if_missing(config)
    resolve_local_paths(config)
    pass_probe_settings_to_workers(config)
    if config.trainer.get("device", "cuda") == "cpu":
        from egpo.cpu.platform import select_cpu_platform

        select_cpu_platform(config)
    auto_set_device(config)
    check_ray_cluster_settings(config)
    check_cpu_backend(config)
    select_agent_loop_manager(config, settings)
    check_rollout_entropy_path(config, settings)
    check_token_selection(config, settings)
    prepare_actor_entropy(config, settings)
    config = migrate_legacy_reward_impl(config)
    if settings.enabled:
        resolve_think_token_ids(config, load_tokenizer(config))
    if preflight:
        from egpo.preflight import startup_preflight

        startup_preflight(config)
    return config


def run(config: DictConfig) -> None:
    register_estimator()
    config = prepare_config(config)
    from egpo.trainer.placement import OnDriverNode

    main_ppo.run_ppo(config, task_runner_class=OnDriverNode(ray.remote(num_cpus=1)(EgpoTaskRunner)))


# verl's config names with egpo's equivalent (verl's + egpo's keys), found without --config-path
EGPO_EQUIVALENTS = {"ppo_trainer": "egpo_trainer", "ppo_megatron_trainer": "egpo_megatron_trainer"}


def refuse_verl_config_name(argv: list[str]) -> None:
    """``--config-name=ppo_megatron_trainer`` without ``--config-path``: Hydra would say only "Cannot find primary
    config"; egpo ships the same config with its keys under another name."""
    args = iter(argv)
    name, has_path = None, False
    for arg in args:
        key, _, value = arg.partition("=")
        if key in ("--config-name", "-cn"):
            name = value or next(args, None)
        elif key in ("--config-path", "-cp", "--config-dir", "-cd"):
            has_path = True
    if name in EGPO_EQUIVALENTS and not has_path:
        raise SystemExit(
            f"--config-name={name} is verl's config; egpo.main ships it with egpo's keys as "
            f"--config-name={EGPO_EQUIVALENTS[name]} (or give --config-path to your own copy of {name})"
        )


@hydra.main(config_path="config", config_name="egpo_trainer", version_base=None)
def hydra_main(config: DictConfig) -> None:
    run(config)


def main() -> None:
    import sys

    refuse_verl_config_name(sys.argv[1:])
    hydra_main()


if __name__ == "__main__":
    main()
