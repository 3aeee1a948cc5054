"""Everything egpo does to a run's config in the driver, before Ray: one pass that completes the config (what egpo
sets in verl's config) and checks it (what egpo refuses), every check's problems a finding.

:func:`prepare` runs every step, in the order read below, and returns the completed config with all findings: a
check's error does not stop the others (the steps that need the ``algorithm`` settings are skipped when those are
refused, and a warning says so). ``python -m egpo.main`` refuses the run when any finding is an error
(:func:`prepare_config`); ``python -m egpo.preflight`` prints all of them. The order is the one verl needs: the keys
and the stack first, then the paths, the outputs and the devices, then the rollout path, the actor's entropy and
the thinking markers, then the preflight's figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from egpo.errors import EgpoError
from egpo.preflight.findings import Finding, error, refusal, refused, warning


def demo_wanted(config: DictConfig) -> bool:
    from egpo.options import OptionError, at

    try:
        demo = at(config, "egpo_demo")
    except OptionError:
        return True  # refused where it is built (build_demo_if_missing)
    return demo is not None and demo.build_if_missing


def build_demo_if_missing(config: DictConfig, echo=print) -> list[Finding]:
    """Recipes with an ``egpo_demo`` node (recipes/cpu_smoke.yaml) get the tiny model and task built on first use; a
    vLLM rollout's in ``<egpo_demo.out>/vllm``, with the attention heads vLLM's CPU attention runs."""
    from egpo.options import OptionError, at

    try:
        options = at(config, "egpo_demo")
    except OptionError as err:
        return [refused("demo", err)]
    if options is not None and options.build_if_missing:
        from egpo.demo.build import VLLM_DEMO, build
        from egpo.settings import rollout_name

        head_dim = None
        if rollout_name(config) == "vllm":
            from egpo.demo.build import VLLM_HEAD_DIM

            head_dim = VLLM_HEAD_DIM
            config.egpo_demo.out = f"{str(options.out).rstrip('/')}/{VLLM_DEMO}"
            echo(f"[egpo] the demo for rollout.name=vllm: {config.egpo_demo.out} (attention heads of {head_dim}, the "
                 "smallest vLLM's CPU attention runs)")
        try:
            build(config.egpo_demo.out, seed=options.seed, warm=options.warm, head_dim=head_dim)
        except EgpoError as err:
            return [refused("demo", err)]
    return []


def pass_probe_settings_to_workers(config: DictConfig) -> list[Finding]:
    """``egpo.probe.*`` (validated here) travels to the actor workers inside ``actor_rollout_ref``."""
    from omegaconf import open_dict

    from egpo.probe.settings import WORKER_KEY, ProbeSettings

    node = OmegaConf.select(config, "egpo.probe", default=None)
    try:
        enabled = ProbeSettings.from_config(node).enable
    except EgpoError as err:
        return [refused("probe", err)]
    found = []
    if enabled and config.actor_rollout_ref.actor.get("strategy", "fsdp") == "megatron":
        found.append(error("probe", "egpo.probe.enable=true hooks verl's FSDP actor, but "
                                    "actor_rollout_ref.actor.strategy=megatron; set ++egpo.probe.enable=false (or "
                                    "train with actor_rollout_ref.actor.strategy=fsdp2)"))
    elif enabled:
        from egpo.compat.versions import verl_version
        from egpo.compat.workers import worker_family, workers

        family = worker_family(config)
        if workers(config).probe_worker is None:
            found.append(error("probe", f"egpo.probe.enable=true hooks no verl {verl_version()} {family} worker; set "
                                        "++egpo.probe.enable=false (or trainer.use_legacy_worker_impl=auto)"))
    with open_dict(config.actor_rollout_ref):
        config.actor_rollout_ref[WORKER_KEY] = node if node is not None else {"enable": False}
    return found


@dataclass
class Prepared:
    """The config after every step, and every finding."""

    config: DictConfig
    findings: list[Finding] = field(default_factory=list)
    settings: object = None  # the run's EgpoSettings, read once here (None: refused)


def read_settings(config: DictConfig):
    """-> (the run's ``algorithm`` settings, or None where they are refused; the findings)."""
    from egpo.settings import EgpoSettings, rollout_name

    try:
        return EgpoSettings.from_algorithm(config.algorithm, rollout_name=rollout_name(config)), []
    except EgpoError as err:
        return None, [refused("algorithm", err)]


def prepare(config: DictConfig, preflight: bool = True, echo=print) -> Prepared:
    """Complete and check ``config`` (changed in place, and returned in :class:`Prepared` with every finding).

    ``preflight``: also the cheap preflight checks (data files, loggers, batch arithmetic, the run's generation
    budget; :func:`egpo.preflight.preflight_findings`), their warnings and facts echoed; ``python -m egpo.preflight``
    runs them itself, all of them, with the prompt lengths.
    """
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.utils.device import auto_set_device

    from egpo.console import quiet_workers
    from egpo.preflight.actor_entropy import prepare_actor_entropy
    from egpo.preflight.cpu_backend import check_cpu_backend
    from egpo.preflight.key_check import check_unknown_keys
    from egpo.preflight.paths import resolve_local_paths
    from egpo.preflight.policy_loss import check_policy_loss
    from egpo.preflight.ray_cluster import check_ray_cluster_settings
    from egpo.preflight.rollout_path import check_rollout_entropy_path, select_agent_loop_manager
    from egpo.preflight.stack import check_stack
    from egpo.preflight.think_tokens import think_token_findings
    from egpo.preflight.token_selection import check_token_selection
    from egpo.runs.main_dir import complete_run_outputs

    found: list[Finding] = []
    found += check_unknown_keys(config)
    found += check_stack(config)
    settings, settings_found = read_settings(config)
    found += settings_found
    demo_built = True
    if demo_wanted(config) and refusal(found):  # nothing is built for a run that is refused anyway
        demo_built = False
        found.append(warning("demo", "the demo model was not made ready (copied or built) and its tokenizer not read: "
                                     "the error above comes first"))
    elif demo_wanted(config):
        demo_found = build_demo_if_missing(config, echo)
        found += demo_found
        demo_built = not demo_found
    resolve_local_paths(config)
    complete_run_outputs(config)
    quiet_workers(config)
    found += pass_probe_settings_to_workers(config)
    if config.trainer.get("device", "cuda") == "cpu":
        from egpo.cpu.platform import select_cpu_platform

        select_cpu_platform(config)
    auto_set_device(config)
    found += check_ray_cluster_settings(config)
    found += check_cpu_backend(config)
    found += check_policy_loss(config)
    if settings is None:
        found.append(warning("algorithm", "the rollout path, the 80/20 rule, the actor's entropy and the thinking "
                                          "markers were not checked: fix algorithm.* first"))
    else:
        select_agent_loop_manager(config, settings)
        found += check_rollout_entropy_path(config, settings)
        found += check_token_selection(config, settings)
        found += prepare_actor_entropy(config, settings, echo)
    config = migrate_legacy_reward_impl(config)
    if settings is not None and demo_built:
        found += think_token_findings(config, settings)
    if preflight and not refusal(found):
        from egpo.preflight import startup_preflight

        found += startup_preflight(config, settings, echo)
    return Prepared(config, found, settings)


def prepare_config(config: DictConfig, preflight: bool = True, echo=print) -> DictConfig:
    """:func:`prepare`, refusing the run on any error: the one refusal as it was raised (its fixes kept), or all of
    them, one line each."""
    result = prepare(config, preflight=preflight, echo=echo)
    err = refusal(result.findings)
    if err is not None:
        raise err
    return result.config
