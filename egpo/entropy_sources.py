"""The entropy sources (``algorithm.entropy_source``), one :class:`EntropySource` each: what the advantage reads,
where it comes from, what it needs, and what it costs. Everything that depends on the source reads it here: the
setting's allowed values and help (:mod:`egpo.advantage.config`), the batch keys (:mod:`egpo.keys`), the settings'
questions (:mod:`egpo.settings`), the ablation's arms (:mod:`egpo.ablation.arms`), the trainer's keep-and-drop and
its messages (:mod:`egpo.trainer`), and the preflight's checks and driver costs (:mod:`egpo.preflight`).
``tests/test_entropy_sources.py`` fails while a source is added to some of them and not to the others.

Where each is born: ``actor``, verl's old-log-prob recompute (its ``entropys``, kept by :mod:`egpo.trainer.
ray_trainer`); ``rollout``, the rollout engine's sampler (:mod:`egpo.rollout`, put into the batch by egpo's agent
loop); ``surprisal``, verl's own rollout log probs, negated where the advantage reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

# The batch keys the sources are read from (egpo.keys re-exports them, beside the other keys egpo adds).
# Per-token entropy produced by the rollout engine while sampling, (bs, response_length), 0 on padding.
ROLLOUT_ENTROPY = "rollout_entropy"
# The actor's recompute entropy (verl's `entropys`), kept by the trainer until the advantage is computed.
ACTOR_ENTROPY = "egpo_actor_entropy"
# verl's own key: the rollout engine's log probability of each sampled token, (bs, response_length), 0 on padding;
# filled with actor_rollout_ref.rollout.calculate_log_probs=true. Its negation is the sampled token's surprisal.
ROLLOUT_LOG_PROBS = "rollout_log_probs"
LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs"  # the setting that has verl keep ROLLOUT_LOG_PROBS


@dataclass(frozen=True)
class EntropySource:
    name: str
    batch_key: str  # where the advantage reads it in verl's step batch
    words: str  # "from the {words}", in the start-up line
    help: str  # what it is, in the setting's help and its refusal
    negated: bool  # the key holds log p: the entropy read is its negation (a new tensor; verl's key stays)
    egpo_key: bool  # egpo puts the key into the batch (and drops it before the actor update); else it is verl's
    from_recompute: bool  # born in the actor's old-log-prob recompute, which bypass mode skips
    from_engine: bool  # born in the rollout engine's sampler: an engine egpo reads entropy from, egpo's agent loop
    needs_log_probs: bool  # verl keeps its key only with LOG_PROBS=true
    actor_entropy_use: str  # what the actor's recompute entropy is for in a run of this source, in words
    agreement_prefix: str  # its agreement with the actor's entropy, measured where both exist ("": none, it is it)
    driver_bytes: int  # bytes per response token it adds to the driver's step batch beyond verl's own (fp32: 4)
    cost_words: str  # that cost, in the preflight's words
    missing: str  # why a batch lacks its key, and the fix ({key}, {engines}, {log_probs} filled in)


SOURCES: dict[str, EntropySource] = {source.name: source for source in (
    EntropySource(
        name="actor", batch_key=ACTOR_ENTROPY, words="actor",
        help="entropy of the old-log-prob recompute",
        negated=False, egpo_key=True, from_recompute=True, from_engine=False, needs_log_probs=False,
        actor_entropy_use="the bonus", agreement_prefix="",
        driver_bytes=4, cost_words="actor entropy kept until the advantage",
        missing="algorithm.entropy_source=actor but the actor's entropy was not kept for the advantage: the step did "
                "not run the old-log-prob recompute through egpo.trainer.EgpoRayPPOTrainer. Run through `python -m "
                "egpo.main`."),
    EntropySource(
        name="rollout", batch_key=ROLLOUT_ENTROPY, words="rollout",
        help="entropy returned by the rollout engine while sampling",
        negated=False, egpo_key=True, from_recompute=False, from_engine=True, needs_log_probs=False,
        actor_entropy_use="the rollout-vs-actor agreement, egpo/entropy_rollout_vs_actor/*",
        agreement_prefix="egpo/entropy_rollout_vs_actor/",
        driver_bytes=4, cost_words="rollout entropy",
        missing="algorithm.entropy_source=rollout but the batch has no '{key}': the rollout did not return per-token "
                "entropy. Use egpo's rollout path (the egpo recipes set actor_rollout_ref.rollout.agent."
                "agent_loop_manager_class to egpo's entropy agent-loop manager, which serves rollout names "
                "{engines}), or use algorithm.entropy_source=actor."),
    EntropySource(
        name="surprisal", batch_key=ROLLOUT_LOG_PROBS, words="rollout's surprisal (-log p of each sampled token)",
        help="-log p of each sampled token, from the rollout's log probs (rollout.calculate_log_probs=true)",
        negated=True, egpo_key=False, from_recompute=False, from_engine=False, needs_log_probs=True,
        actor_entropy_use="the surprisal-vs-actor agreement, egpo/surprisal_vs_actor_entropy/*",
        agreement_prefix="egpo/surprisal_vs_actor_entropy/",
        driver_bytes=4, cost_words="surprisal",
        missing="algorithm.entropy_source=surprisal reads -log p of each sampled token from verl's '{key}', which "
                "this batch lacks: the rollout returns its log probs only with ++{log_probs}=true (or use "
                "algorithm.entropy_source=actor)."),
)}
ENTROPY_SOURCES = tuple(SOURCES)  # the setting's allowed values, the default first
DEFAULT_SOURCE = ENTROPY_SOURCES[0]


def source_help() -> str:
    """Every source in a line: the setting's help, and its refusal of an unknown one."""
    return "; ".join(f"{s.name}: {s.help}" for s in SOURCES.values())
