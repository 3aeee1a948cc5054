"""Every step of the pass, in one list, in the order it runs: what egpo completes in a run's config and what it
checks, then the preflight's figures.

Each step takes ``(config, run)`` (:class:`egpo.preflight.run_facts.Run`: the run's facts, read once) and returns its
findings (a list, or one finding, or None). Where a step goes:

* ``start-up``: every pass (``python -m egpo.main``, ``egpo.generate``, ``egpo.preflight``).
* ``figure``: the preflight's figures. ``python -m egpo.main`` runs them before Ray once nothing is refused and
  refuses the run on their errors; ``python -m egpo.preflight`` runs them all and prints every finding.
* ``preflight``: ``python -m egpo.preflight`` only (reading the tokenizer for the prompt lengths).

A step runs only where its ``needs`` hold (:data:`NEEDS`); the steps skipped for one unmet need are named in one
warning. A step that applies to some runs only says so in ``applies`` and is neither run nor named elsewhere.
A new check is one more :class:`Step` here, placed after the steps that complete what it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from omegaconf import DictConfig

from egpo.engines import load
from egpo.preflight.findings import Finding, refusal, warning
from egpo.preflight.run_facts import Run

WHEN = ("start-up", "figure", "preflight")
DEMO = "the demo model"  # the step that makes a demo recipe's model ready, which the model's readers need


@dataclass(frozen=True)
class Need:
    holds: Callable[[Run, list[Finding]], bool]  # (the facts, the findings so far)
    topic: str
    why: str  # the skipped steps' warning ends with it


NEEDS = {
    "stack": Need(lambda run, found: run.stack is not None, "stack",
                  "this verl is not one egpo runs (above)"),
    "settings": Need(lambda run, found: run.settings is not None, "algorithm",
                     "fix algorithm.* first"),
    "clean": Need(lambda run, found: refusal(found) is None, "demo", "the error above comes first"),
    "model": Need(lambda run, found: DEMO not in run.skipped and not any(
        f.level == "error" and f.topic in ("demo", "model") for f in found), "model",
        "the model is not ready (above)"),
}


@dataclass(frozen=True)
class Step:
    what: str  # what it completes or checks, as the skipped steps' warning names it
    # "module:function" (config, run) -> its findings: a list, one finding or None; imported when it runs
    run: str
    when: str = "start-up"
    needs: tuple[str, ...] = ()
    applies: str | None = None  # "module:function" (config, run) -> bool; None: every run

    def __post_init__(self):
        if self.when not in WHEN or not set(self.needs) <= set(NEEDS):
            raise ValueError(f"step {self.what!r}: when is one of {WHEN}, needs among {tuple(NEEDS)}")


P = "egpo.preflight"
STEPS = (
    # the config's keys and the stack it runs on
    Step("misspelled keys", f"{P}.key_check:check_unknown_keys"),
    Step("the verl stack", f"{P}.stack:check_stack", needs=("stack",)),
    # what egpo completes in verl's config
    Step(DEMO, f"{P}.prepare:build_demo_if_missing", needs=("clean",),
         applies=f"{P}.prepare:demo_wanted"),
    Step("the data paths", f"{P}.prepare:resolve_data_paths"),
    Step("the run's outputs", f"{P}.prepare:complete_outputs"),
    Step("the probe", f"{P}.prepare:pass_probe_settings_to_workers", needs=("stack",)),
    Step("the device", f"{P}.prepare:select_device"),
    # what the run would die of, or train something else than asked
    Step("a joined Ray cluster", f"{P}.ray_cluster:check_ray_cluster_settings"),
    Step("the CPU backend", f"{P}.cpu_backend:check_cpu_backend", needs=("stack",)),
    Step("the policy loss", f"{P}.policy_loss:check_policy_loss", needs=("stack",)),
    Step("the agent-loop manager", f"{P}.rollout_path:select_agent_loop_manager", needs=("settings",)),
    Step("the rollout path", f"{P}.rollout_path:check_rollout_entropy_path", needs=("settings",)),
    Step("the 80/20 rule", f"{P}.token_selection:check_token_selection", needs=("settings", "stack")),
    Step("the actor's entropy", f"{P}.actor_entropy:prepare_actor_entropy", needs=("settings", "stack")),
    Step("verl's reward config", f"{P}.prepare:migrate_reward_config"),
    Step("the <think> ids", f"{P}.think_tokens:think_token_findings", needs=("settings", "model")),
    # the preflight's figures
    Step("the prompt lengths", f"{P}.think_tokens:read_tokenizer_step", when="preflight", needs=("model",)),
    Step("the data files", f"{P}.data:data_findings", when="figure"),
    Step("the generation budget", f"{P}.budget:generation_findings", when="figure"),
    Step("what egpo adds per GPU, on the driver and on disk", f"{P}.scale:run_scale_findings", when="figure",
         needs=("settings", "stack")),
    Step("the engine installed", f"{P}.stack:engine_installed_finding", when="figure", needs=("stack",)),
    Step("the actor's attention", f"{P}.stack:attention_finding", when="figure", needs=("stack",)),
    Step("/dev/shm", f"{P}.cpu_backend:leftover_finding", when="figure"),
    Step("the loggers", f"{P}.loggers:logger_findings", when="figure"),
    Step("the batch arithmetic", f"{P}.batch:batch_findings", when="figure", needs=("stack",)),
    Step("the engines", f"{P}.engines:engine_findings", when="figure", needs=("settings", "stack")),
    Step("the temperature", f"{P}.temperature:temperature_finding", when="figure", needs=("settings",)),
)


def _as_list(result) -> list[Finding]:
    if result is None:
        return []
    return [result] if isinstance(result, Finding) else list(result)


def run_steps(config: DictConfig, run: Run, when: tuple[str, ...], found: list[Finding] | None = None) -> list[Finding]:
    """The findings of the steps of :data:`STEPS` that run ``when``, in order, after ``found`` (the findings so far,
    which the needs read); the steps skipped for an unmet need, named in one warning per need."""
    found = list(found or [])
    new: list[Finding] = []
    skipped: dict[str, list[str]] = {}
    for step in STEPS:
        if step.when not in when:
            continue
        if step.applies is not None and not load(step.applies)(config, run):
            continue
        unmet = next((need for need in step.needs if not NEEDS[need].holds(run, found + new)), None)
        if unmet is not None:
            skipped.setdefault(unmet, []).append(step.what)
            run.skipped.add(step.what)
            continue
        new += _as_list(load(step.run)(config, run))
    for need, whats in skipped.items():
        new.append(warning(NEEDS[need].topic, f"not completed or checked: {'; '.join(whats)}: {NEEDS[need].why}"))
    return new
