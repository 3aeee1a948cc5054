"""Everything egpo does to a run's config in the driver, before Ray: one pass of named steps that complete the config
(what egpo sets in verl's config) and check it (what egpo refuses), every refusal a finding.

:func:`prepare` runs every step it can and returns the completed config with all findings: a refused step does not
stop the others (a step that needs the ``algorithm`` settings is skipped when they are refused, and says so).
``python -m egpo.main`` refuses the run when any finding is an error (:func:`prepare_config`);
``python -m egpo.preflight`` prints all of them. The order is the one verl needs: the stack and the keys first, then
the paths and the devices, then the rollout path, the actor's entropy and the thinking markers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig, OmegaConf

from egpo.errors import EgpoConfigError, EgpoError
from egpo.preflight.findings import Finding, error, warning


def build_demo_if_missing(config: DictConfig, echo=print) -> None:
    """Recipes with an ``egpo_demo`` node (recipes/cpu_smoke.yaml) get the tiny model and task built on first use; a
    vLLM rollout's in ``<egpo_demo.out>/vllm``, with the attention heads vLLM's CPU attention runs."""
    demo = config.get("egpo_demo", None)
    if demo and demo.get("build_if_missing", False):
        from egpo.demo.build import VLLM_DEMO, build

        head_dim = None
        if OmegaConf.select(config, "actor_rollout_ref.rollout.name", default=None) == "vllm":
            from egpo.demo.build import VLLM_HEAD_DIM

            head_dim = VLLM_HEAD_DIM
            demo.out = f"{str(demo.out).rstrip('/')}/{VLLM_DEMO}"
            echo(f"[egpo] the demo for rollout.name=vllm: {demo.out} (attention heads of {head_dim}, the smallest "
                 "vLLM's CPU attention runs)")
        build(demo.out, seed=int(demo.get("seed", 0)), warm=bool(demo.get("warm", False)), head_dim=head_dim)


def pass_probe_settings_to_workers(config: DictConfig) -> None:
    """``egpo.probe.*`` (validated here) travels to the actor workers inside ``actor_rollout_ref``."""
    from omegaconf import open_dict

    from egpo.probe.settings import WORKER_KEY, ProbeSettings

    node = OmegaConf.select(config, "egpo.probe", default=None)
    enabled = ProbeSettings.from_config(node).enable
    if enabled and config.actor_rollout_ref.actor.get("strategy", "fsdp") == "megatron":
        raise EgpoConfigError(
            "egpo.probe.enable=true hooks verl's FSDP actor, but actor_rollout_ref.actor.strategy=megatron; set "
            "++egpo.probe.enable=false (or train with actor_rollout_ref.actor.strategy=fsdp2)"
        )
    if enabled:
        from egpo.compat.versions import verl_version
        from egpo.compat.workers import PROBE_WORKER, worker_family

        family = worker_family(config)
        if (verl_version(), family) not in PROBE_WORKER:
            raise EgpoConfigError(f"egpo.probe.enable=true hooks no verl {verl_version()} {family} worker; set "
                                  "++egpo.probe.enable=false (or trainer.use_legacy_worker_impl=auto)")
    with open_dict(config.actor_rollout_ref):
        config.actor_rollout_ref[WORKER_KEY] = node if node is not None else {"enable": False}


@dataclass
class Prepared:
    """The config after every step that ran, the findings, and the refusals behind the error findings."""

    config: DictConfig
    findings: list[Finding] = field(default_factory=list)
    refusals: list[EgpoError] = field(default_factory=list)

    def refuse(self, topic: str, err: EgpoError) -> None:
        self.findings.append(error(topic, str(err)))
        self.refusals.append(err)


def _select_cpu_platform(config: DictConfig) -> None:
    if config.trainer.get("device", "cuda") == "cpu":
        from egpo.cpu.platform import select_cpu_platform

        select_cpu_platform(config)


def _think_tokens(config: DictConfig, settings) -> None:
    from egpo.trainer.config import load_tokenizer, resolve_think_token_ids

    if not settings.enabled:
        return
    from egpo.preflight.model_source import model_source_problem

    problem = model_source_problem(config.actor_rollout_ref.model.path)
    if problem:
        raise EgpoConfigError(f"{problem}; egpo reads the <think> ids from its tokenizer")
    try:
        tokenizer = load_tokenizer(config)
    except EgpoError:
        raise
    except Exception as err:  # noqa: BLE001 - a model that cannot be read is a finding, whatever the loader raised
        raise EgpoConfigError(
            f"cannot load the tokenizer of actor_rollout_ref.model.path={config.actor_rollout_ref.model.path} "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); egpo reads the <think> ids "
            "from it: give a local model folder, or the hub id on a machine that reaches the hub") from None
    resolve_think_token_ids(config, tokenizer)


def prepare(config: DictConfig, preflight: bool = True, echo=print) -> Prepared:
    """Complete and check ``config`` (changed in place, and returned in :class:`Prepared` with every finding).

    ``preflight``: also the cheap preflight checks (data files, loggers, batch arithmetic, the run's generation
    budget; :func:`egpo.preflight.preflight_findings`), their warnings and facts echoed; ``python -m egpo.preflight``
    runs them itself, all of them, with the prompt lengths.
    """
    from verl.experimental.reward_loop import migrate_legacy_reward_impl
    from verl.utils.device import auto_set_device

    from egpo.preflight.stack import check_stack
    from egpo.preflight.paths import resolve_local_paths
    from egpo.console import quiet_workers
    from egpo.run_dir import complete_run_outputs
    from egpo.settings import EgpoSettings
    from egpo.trainer.actor_entropy import prepare_actor_entropy
    from egpo.trainer.key_check import check_unknown_keys
    from egpo.trainer.startup_checks import (check_cpu_backend, check_ray_cluster_settings, check_rollout_entropy_path,
                                             check_token_selection, select_agent_loop_manager)

    result = Prepared(config)

    def step(topic: str, fn, *args) -> bool:
        try:
            fn(*args)
        except EgpoError as err:
            result.refuse(topic, err)
            return False
        return True

    step("keys", check_unknown_keys, config)
    step("stack", check_stack, config)
    rollout_name = OmegaConf.select(config, "actor_rollout_ref.rollout.name", default=None, throw_on_missing=False)
    settings = None
    try:
        settings = EgpoSettings.from_algorithm(config.algorithm, rollout_name=rollout_name)
    except EgpoError as err:
        result.refuse("algorithm", err)
    demo_missing = bool((config.get("egpo_demo", None) or {}).get("build_if_missing", False))
    if demo_missing and result.refusals:  # nothing is built for a run that is refused anyway
        result.findings.append(warning("demo", "the demo model was not built (the run is refused above), so its "
                                               "tokenizer was not read"))
    elif demo_missing:
        demo_missing = not step("demo", build_demo_if_missing, config, echo)
    step("paths", resolve_local_paths, config)
    step("outputs", complete_run_outputs, config)
    step("console", quiet_workers, config)
    step("probe", pass_probe_settings_to_workers, config)
    step("cpu", _select_cpu_platform, config)
    auto_set_device(config)
    step("ray", check_ray_cluster_settings, config)
    step("cpu", check_cpu_backend, config)
    if settings is None:
        result.findings.append(warning("algorithm", "the rollout path, the 80/20 rule, the actor's entropy and the "
                                                  "thinking markers were not checked: fix algorithm.* first"))
    else:
        if step("rollout", select_agent_loop_manager, config, settings):
            step("rollout", check_rollout_entropy_path, config, settings)
        step("80/20", check_token_selection, config, settings)
        step("actor", prepare_actor_entropy, config, settings, echo)
    result.config = config = migrate_legacy_reward_impl(config)
    if settings is not None and not demo_missing:
        step("model", _think_tokens, config, settings)
    if preflight and not result.refusals:
        from egpo.preflight import startup_preflight

        step("preflight", startup_preflight, config, echo)
    return result


def prepare_config(config: DictConfig, preflight: bool = True, echo=print) -> DictConfig:
    """:func:`prepare`, refusing the run on any error: the one refusal as it was raised (its fixes kept), or all of
    them, one line each."""
    result = prepare(config, preflight=preflight, echo=echo)
    if len(result.refusals) == 1:
        raise result.refusals[0]
    if result.refusals:
        errors = [f.line() for f in result.findings if f.level == "error"]
        raise EgpoConfigError(f"{len(result.refusals)} problems:\n" + "\n".join(errors))
    return result.config
