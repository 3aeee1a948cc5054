"""Names of what egpo adds to verl's batch, in one place."""

# The entropy sources' keys are declared with the sources (egpo.entropy_sources): the rollout engine's per-token
# entropy, the actor's recompute entropy kept until the advantage, and verl's own rollout log probs (the surprisal's)
from egpo.entropy_sources import ACTOR_ENTROPY, ROLLOUT_ENTROPY, ROLLOUT_LOG_PROBS, SOURCES  # noqa: F401
# meta_info entry that carries egpo's step metrics from where they are measured to the step's metrics.
STEP_METRICS = "egpo_step_metrics"
# Step metrics: the bytes of verl's step batch's tensors at the advantage, at their fullest (egpo's keys still in it),
# and of egpo's own keys among them: the preflight's figures for the driver checked against a run (egpo.rehearse).
STEP_BATCH_BYTES = "egpo/step_batch_bytes"
EGPO_BATCH_BYTES = "egpo/egpo_batch_bytes"

# The response mask narrowed to the tokens the actor update trains on (algorithm.egpo_token_selection=top_entropy),
# (bs, response_length), set with the advantage and swapped in for response_mask during the actor update only.
UPDATE_MASK = "egpo_update_mask"

# where each algorithm.entropy_source is read from (surprisal: the negation of verl's rollout log probs)
ENTROPY_KEY_BY_SOURCE = {source.name: source.batch_key for source in SOURCES.values()}
# Dropped before the actor update: nothing downstream of the advantage reads them (verl's rollout log probs stay:
# verl's rollout correction reads them).
TRANSIENT_BATCH_KEYS = tuple(dict.fromkeys(source.batch_key for source in SOURCES.values() if source.egpo_key))

# A request's sampling parameter from egpo's agent-loop worker to the hf rollout server: which row of the rollout
# the request samples for (verl's trajectory: data-set index, copy number, validation), so that its seed does not
# depend on arrival order among requests for the same prompt.
SAMPLE_KEY = "egpo_sample_key"
