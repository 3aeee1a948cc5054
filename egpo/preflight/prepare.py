"""Everything egpo does to a run's config in the driver, before Ray: one pass that completes the config (what egpo
sets in verl's config) and checks it (what egpo refuses), every check's problems a finding.

:func:`prepare` reads the run's facts once (:mod:`egpo.preflight.run_facts`) and runs the steps of
:data:`egpo.preflight.checks.STEPS` in their order, returning the completed config with all findings: a check's
error does not stop the others (a step whose facts could not be read is skipped, and a warning names it).
``python -m egpo.main`` refuses the run when any finding is an error (:func:`prepare_config`); ``python -m
egpo.preflight`` prints all of them. The completing steps that are egpo's own live here (the demo, the probe's
settings, the device, verl's reward keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

from egpo.errors import EgpoError
from egpo.preflight.findings import Finding, error, refusal, refused

if TYPE_CHECKING:
    from egpo.preflight.run_facts import Run
    from egpo.settings import EgpoSettings


def demo_wanted(config: DictConfig, run=None) -> bool:
    from egpo.options import OptionError, at

    try:
        demo = at(config, "egpo_demo")
    except OptionError:
        return True  # refused where it is built (build_demo_if_missing)
    return demo is not None and demo.build_if_missing


def build_demo_if_missing(config: DictConfig, run) -> list[Finding]:
    """Recipes with an ``egpo_demo`` node (recipes/cpu_smoke.yaml) get the tiny model and task built on first use; a
    vLLM rollout's in ``<egpo_demo.out>/vllm``, with the attention heads vLLM's CPU attention runs."""
    from egpo.options import OptionError, at

    try:
        options = at(config, "egpo_demo")
    except OptionError as err:
        return [refused("demo", err)]
    if options is not None and options.build_if_missing:
        from egpo.demo.build import VLLM_DEMO, build

        head_dim = None
        if run.rollout == "vllm":
            from egpo.demo.build import VLLM_HEAD_DIM

            head_dim = VLLM_HEAD_DIM
            config.egpo_demo.out = f"{str(options.out).rstrip('/')}/{VLLM_DEMO}"
            run.say(f"[egpo] the demo for rollout.name=vllm: {config.egpo_demo.out} (attention heads of {head_dim}, "
                    "the smallest vLLM's CPU attention runs)")
        try:
            build(config.egpo_demo.out, seed=options.seed, warm=options.warm, head_dim=head_dim)
        except EgpoError as err:
            return [refused("demo", err)]
    return []


def pass_probe_settings_to_workers(config: DictConfig, run) -> list[Finding]:
    """``egpo.probe.*`` (validated here) travels to the actor workers inside ``actor_rollout_ref``."""
    from omegaconf import open_dict

    from egpo.probe.settings import WORKER_KEY, ProbeSettings

    node = OmegaConf.select(config, "egpo.probe", default=None)
    try:
        enabled = ProbeSettings.from_config(node).enable
    except EgpoError as err:
        return [refused("probe", err)]
    found = []
    if enabled and run.strategy == "megatron":
        found.append(error("probe", "egpo.probe.enable=true hooks verl's FSDP actor, but "
                                    "actor_rollout_ref.actor.strategy=megatron; set ++egpo.probe.enable=false (or "
                                    "train with actor_rollout_ref.actor.strategy=fsdp2)"))
    elif enabled and run.workers.probe_worker is None:
        found.append(error("probe", f"egpo.probe.enable=true hooks no verl {run.verl} {run.family} worker; set "
                                    "++egpo.probe.enable=false (or trainer.use_legacy_worker_impl=auto)"))
    with open_dict(config.actor_rollout_ref):
        config.actor_rollout_ref[WORKER_KEY] = node if node is not None else {"enable": False}
    return found


@dataclass
class Prepared:
    """The config after every step, every finding, and the run's facts the steps read."""

    config: DictConfig
    findings: list[Finding]
    run: Run

    @property
    def settings(self) -> EgpoSettings | None:
        """The run's ``algorithm.*`` settings, as the pass read them (None: refused)."""
        return self.run.settings


def resolve_data_paths(config: DictConfig, run=None) -> None:
    """Relative data paths resolved where the command runs (:mod:`egpo.preflight.paths`)."""
    from egpo.preflight.paths import resolve_local_paths

    resolve_local_paths(config)


def complete_outputs(config: DictConfig, run=None) -> None:
    """The run's folders and names completed (:mod:`egpo.runs.main_dir`), its workers' logs quieted."""
    from egpo.console import quiet_workers
    from egpo.runs.main_dir import complete_run_outputs

    complete_run_outputs(config)
    quiet_workers(config)


def select_device(config: DictConfig, run) -> None:
    """verl's device for the run (``trainer.device=cpu``: egpo's CPU platform first)."""
    from verl.utils.device import auto_set_device

    if run.on_cpu:
        from egpo.cpu.platform import select_cpu_platform

        select_cpu_platform(config)
    auto_set_device(config)


def migrate_reward_config(config: DictConfig, run=None) -> None:
    """verl's legacy reward keys moved into ``reward.*``, as verl's own entry point does (in place)."""
    from verl.experimental.reward_loop import migrate_legacy_reward_impl

    migrate_legacy_reward_impl(config)


PREFLIGHTS = (None, "start-up", "all")


def prepare(config: DictConfig, preflight: str | None = "start-up", echo=print) -> Prepared:
    """Complete and check ``config`` (changed in place, and returned in :class:`Prepared` with every finding): the
    run's facts read once (:func:`egpo.preflight.run_facts.read_run`), then :data:`egpo.preflight.checks.STEPS`.

    ``preflight``: None, the start-up steps only; ``"start-up"`` (``python -m egpo.main``), also the figures once
    nothing is refused, their errors one refusal, their warnings and facts echoed; ``"all"`` (``python -m
    egpo.preflight``), every step, the prompt lengths too, whatever was refused.
    """
    from egpo.preflight.checks import WHEN, run_steps
    from egpo.preflight.run_facts import read_run

    if preflight not in PREFLIGHTS:
        raise ValueError(f"preflight is one of {PREFLIGHTS}, not {preflight!r}")
    run, found = read_run(config, say=echo)
    if preflight == "all":
        return Prepared(config, found + run_steps(config, run, WHEN, found), run)
    found += run_steps(config, run, ("start-up",), found)
    if preflight == "start-up" and not refusal(found):
        found += startup_figures(config, run, found, echo)
    return Prepared(config, found, run)


def startup_figures(config: DictConfig, run, found: list[Finding], echo=print) -> list[Finding]:
    """At start-up: the preflight's figures, their errors as one refusal (the run stops), else their warnings and facts
    printed."""
    from egpo.preflight.checks import run_steps

    figures = run_steps(config, run, ("figure",), found)
    errors = [f for f in figures if f.level == "error"]
    if errors:
        return [error("preflight", "preflight: " + "; ".join(f.text for f in errors) +
                      ". Nothing was started (python -m egpo.preflight lists every finding).")]
    for finding in figures:
        echo(f"[egpo preflight] {finding.line()}")
    return figures


def prepare_config(config: DictConfig, preflight: str | None = "start-up", echo=print) -> DictConfig:
    """:func:`prepare`, refusing the run on any error: the one refusal as it was raised (its fixes kept), or all of
    them, one line each."""
    result = prepare(config, preflight=preflight, echo=echo)
    err = refusal(result.findings)
    if err is not None:
        raise err
    return result.config
