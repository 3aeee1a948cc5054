"""Names of what egpo adds to verl's batch, in one place."""

# Per-token entropy produced by the rollout engine while sampling, (bs, response_length), 0 on padding.
ROLLOUT_ENTROPY = "rollout_entropy"
# The actor's recompute entropy (verl's `entropys`), kept by the trainer until the advantage is computed.
ACTOR_ENTROPY = "egpo_actor_entropy"
# meta_info entry that carries egpo's step metrics from where they are measured to the step's metrics.
STEP_METRICS = "egpo_step_metrics"

ENTROPY_KEY_BY_SOURCE = {"actor": ACTOR_ENTROPY, "rollout": ROLLOUT_ENTROPY}
# Dropped before the actor update: nothing downstream of the advantage reads them.
TRANSIENT_BATCH_KEYS = (ACTOR_ENTROPY, ROLLOUT_ENTROPY)
