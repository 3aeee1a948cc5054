"""Preflight findings on the GPU paths a config will take, before the first GPU hour: how the actor's entropy is
computed, whether replicas share one engine seed, which servers a reward model or teacher gets, and whether the
rollout engine is a tested version or one inside a tested range."""

from __future__ import annotations

from omegaconf import OmegaConf

from egpo.preflight.findings import Finding, fact, warning

# where each verl keeps a generative reward model's and a distillation teacher's engine: (enabled key, engine key)
SIDE_MODELS = {
    "reward model": (("reward.reward_model.enable", "reward.reward_model.rollout.name"),
                     ("reward_model.enable", "reward_model.rollout.name")),
    "distillation teacher": (("distillation.enabled", "distillation.teacher_models.teacher_model.rollout.name"),),
}


def _select(config, key, default=None):
    return OmegaConf.select(config, key, default=default, throw_on_missing=False)


def actor_entropy_findings(config, run) -> list[Finding]:
    from egpo.preflight.actor_entropy import actor_entropy_precision, reads_actor_entropy

    if not reads_actor_entropy(run.settings):
        return []
    use = run.settings.actor_entropy_use
    precision = actor_entropy_precision(config, run.entropy_keys)
    if precision == "fp32":
        return [fact("entropy", f"the actor's entropy ({use}) is computed in fp32 "
                                "(egpo.preflight.actor_entropy)")]
    return [warning("entropy", f"the actor's entropy ({use}) would be computed in bf16: {precision}")]


def rollout_replicas(config) -> int:
    rollout = config.actor_rollout_ref.rollout
    per_replica = 1
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        per_replica *= int(rollout.get(key, 1) or 1)
    devices = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    return max(1, devices // per_replica)


def seed_findings(config, stack) -> list[Finding]:
    """``stack``: the installed verl's table entry."""
    from egpo.compat.seeds import shared_engine_seeds

    shared = shared_engine_seeds(config.actor_rollout_ref.rollout)
    replicas = rollout_replicas(config)
    if not shared or replicas < 2:
        return []
    key = stack.rollout_seed_key
    instead = (f"; set the run's seed with ++{key}=N instead (each replica gets replica_rank + N)" if key else
               "; egpo's sglang server and verl's vLLM server then seed each replica from its rank")
    return [warning("seeds", f"{', '.join(shared)} gives all {replicas} rollout replicas one engine seed, so copies of "
                             "a prompt on two replicas can draw the same noise: remove it ("
                             f"{' '.join('~' + k for k in shared)}){instead}")]


def side_model_findings(config) -> list[Finding]:
    findings = []
    for what, places in SIDE_MODELS.items():
        for enabled_key, engine_key in places:
            if _select(config, enabled_key):
                engine = _select(config, engine_key) or "its configured engine"
                findings.append(fact("engines", f"the {what}'s server ({engine}) is verl's own: no entropy patches, "
                                                "log probs or egpo refusals (those are for the policy's rollout)"))
                break
    return findings


def engine_version_findings(described) -> list[Finding]:
    """A rollout engine (``described``: its egpo.engines.Engine) inside a tested range but not itself tested (package
    metadata only, no engine import)."""
    import importlib

    if described is None or described.versions is None:
        return []
    engine_versions = importlib.import_module(described.versions)
    version = getattr(engine_versions, f"installed_{described.name}")()
    note = engine_versions.untested_note(version) if version not in (None, "not installed") else None
    return [warning("engines", note)] if note else []


def engine_findings(config, run) -> list[Finding]:
    return [*actor_entropy_findings(config, run), *seed_findings(config, run.stack), *side_model_findings(config),
            *engine_version_findings(run.engine)]
