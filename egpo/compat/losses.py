"""How verl's actor aggregates a token-mean loss, per verl version: over the whole mini-batch's tokens (across
data-parallel ranks) or over each micro-batch's own.

The 80/20 rule (``algorithm.egpo_token_selection=top_entropy``) hands the actor a narrowed response mask, and
Wang et al. define its loss as the mean over the batch's kept tokens. verl 0.9.1's engine workers (its only ones) and
verl 0.7.1's engine workers (``trainer.use_legacy_worker_impl=disable``) divide by the mini-batch's token count,
summed over ranks. verl 0.7.1's default legacy actor (``DataParallelPPOActor``) divides each micro-batch by its own
token count and scales it by its share of the mini-batch's sequences: each kept token then weighs
1 / (kept tokens of its micro-batch), which varies with how many top-entropy tokens the packed responses hold.
"""

from __future__ import annotations

from egpo.compat.versions import verl_version

# verl version -> the legacy-worker setting that aggregates per micro-batch (None: no such worker)
MICRO_BATCH_TOKEN_MEAN = {"0.7.1": ("auto", "enable"), "0.9.1": None}


def token_mean_per_micro_batch(config, version: str | None = None) -> bool:
    """The actor of this run divides a token-mean loss by each micro-batch's own token count."""
    legacy = MICRO_BATCH_TOKEN_MEAN[version or verl_version()]
    if legacy is None:
        return False
    return str(config.trainer.get("use_legacy_worker_impl", "auto")) in legacy
