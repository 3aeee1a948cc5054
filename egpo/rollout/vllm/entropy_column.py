"""The column egpo's sampler patch appends to vLLM's sampled-token log probs, and how the front end knows it.

The column holds the entropy in the log-prob place and :data:`ENTROPY_COLUMN_ID` in the token-id place: no vocabulary
has a token id -1, so a front end can tell egpo's column from vLLM's own (the sampled token's, always present when
log probs are asked for). A worker that ran without the sampler patch (egpo's ``vllm.general_plugins`` entry point
failed to import in its environment: vLLM logs that and goes on) sends rows without the mark; the front end then leaves
vLLM's log probs as they are and the request comes back without entropy, which egpo's server turns into its error.
"""

from __future__ import annotations

ENTROPY_COLUMN_ID = -1


def split_entropy_column(ids, logprobs):
    """``(entropy, ids, logprobs)`` with egpo's column taken off (numpy rows, one per position); ``entropy`` is None,
    and the arrays are returned unchanged, where the last column does not carry the mark."""
    if ids.ndim != 2 or ids.shape[1] < 2 or not (ids[:, -1] == ENTROPY_COLUMN_ID).all():
        return None, ids, logprobs
    return logprobs[:, -1], ids[:, :-1], logprobs[:, :-1]
