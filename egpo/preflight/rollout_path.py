"""The rollout path: egpo's agent-loop manager where a run needs it (completed here), and an engine that returns the
entropy a run reads from its rollout (checked here, with sglang's and vLLM's own limits), or the log probs its
surprisal is read from."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from egpo.engines import Engine, load
from egpo.errors import EgpoError
from egpo.preflight.findings import Finding, error
from egpo.settings import BYPASS, ENTROPY_ROLLOUTS, LOG_PROBS, ROLLOUT_NAME, EgpoSettings, fix_text

MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"


def _load(path: str):
    from verl.utils.import_utils import load_class_from_fqn

    return load_class_from_fqn(path, "AgentLoopManager")


def select_agent_loop_manager(config: DictConfig, run) -> None:
    """egpo's agent-loop manager where egpo needs it, verl's own path everywhere else.

    With ``adv_estimator=egpo`` (the rollout's entropy into the batch, sglang's entropy server, the tool loop's
    per-turn entropy) or ``rollout.name=hf`` (egpo's CPU rollout), an unset manager becomes egpo's. Any other run
    (GRPO, PPO, ...) keeps verl's manager, replicas, sample order and agent loops. A manager set explicitly is kept
    (and checked by :func:`check_rollout_entropy_path`).
    """
    from omegaconf import open_dict

    from egpo.rollout.agent_loop import MANAGER_PATH

    if OmegaConf.select(config, MANAGER_KEY, default=None):
        return
    if run.settings.enabled or (run.engine is not None and run.engine.cpu_only):
        with open_dict(config):
            OmegaConf.update(config, MANAGER_KEY, MANAGER_PATH, force_add=True)


def check_rollout_entropy_path(config: DictConfig, run) -> list[Finding]:
    """entropy_source=rollout needs an engine that returns entropy and egpo's agent-loop manager (the only path
    into the batch); entropy_source=surprisal needs verl's rollout log probs; rollout.name=hf needs that manager too;
    sglang's and vLLM's entropy limits are checked here already."""
    from egpo.rollout.agent_loop import MANAGER_PATH, EntropyAgentLoopManager

    rollout = config.actor_rollout_ref.rollout
    name, described, settings = run.rollout, run.engine, run.settings
    if settings.reads_surprisal and not OmegaConf.select(config, LOG_PROBS, default=False):
        fixes = ((f"++{LOG_PROBS}=true",),)
        return [error(
            "rollout",
            "algorithm.entropy_source=surprisal reads -log p of each sampled token from the rollout's log probs, which "
            f"verl keeps only with {LOG_PROBS}=true (verl 0.7.1's default is false). "
            f"Fix: {fix_text(fixes)}.",
            fixes,
        )]
    wants_rollout_entropy = settings.reads_rollout_entropy
    if wants_rollout_entropy and name is not None and name not in ENTROPY_ROLLOUTS:
        # actor entropy needs the recompute that bypass mode skips: then that fix turns bypass mode off too
        actor = ("++algorithm.entropy_source=actor", *((f"++{BYPASS}=false",) if settings.bypass_mode else ()))
        fixes = ((f"{ROLLOUT_NAME}=sglang",), actor)
        return [error(
            "rollout",
            f"algorithm.entropy_source=rollout, but {ROLLOUT_NAME}={name} returns no per-token entropy (egpo makes "
            f"sglang and vLLM return it, and its own hf server on a CPU). Fix: {fix_text(fixes)}.",
            fixes,
        )]
    manager_path = (rollout.get("agent", None) or {}).get("agent_loop_manager_class", None)
    uses_ours = bool(manager_path) and issubclass(_load(manager_path), EntropyAgentLoopManager)
    serves = described is not None and (wants_rollout_entropy or not described.only_for_rollout_entropy)
    if uses_ours and serves and described.limits:
        return engine_limit_findings(rollout, settings, described)
    if uses_ours:
        return []
    if wants_rollout_entropy:
        return [error(
            "rollout",
            f"algorithm.entropy_source=rollout, but {MANAGER_KEY}={manager_path!r} does not put the rollout's entropy "
            f"into the batch. Set ++{MANAGER_KEY}={MANAGER_PATH} (or leave it unset: egpo.main selects it) or use "
            "++algorithm.entropy_source=actor."
        )]
    if described is not None and described.cpu_only:
        return [error(
            "rollout",
            f"actor_rollout_ref.rollout.name={name} is egpo's rollout and needs ++{MANAGER_KEY}={MANAGER_PATH} "
            "(or leave it unset: egpo.main selects it)"
        )]
    return []


def engine_limit_findings(rollout: DictConfig, settings: EgpoSettings, described: Engine) -> list[Finding]:
    """The engine's own limits (:mod:`egpo.engines`): a version egpo patches, and no setting under which the entropy
    would be missing or wrong. Where egpo's replica serves the engine only for the rollout's entropy, taking the
    entropy from the actor is a fix too."""
    try:
        load(described.limits)(rollout)
    except EgpoError as err:
        if not described.only_for_rollout_entropy:
            return [error("rollout", str(err))]
        actor = ("++algorithm.entropy_source=actor", *((f"++{BYPASS}=false",) if settings.bypass_mode else ()))
        return [error("rollout", f"{str(err).rstrip('.')}. Or take the entropy from the actor: {fix_text((actor,))}",
                      (actor,))]
    return []
