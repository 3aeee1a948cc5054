"""Where a rollout server's per-token entropy joins verl's ``TokenOutput`` (shared by the sglang and vLLM servers)."""

from __future__ import annotations

from egpo.keys import ROLLOUT_ENTROPY


def attach_rollout_entropy(output, entropy: list[float] | None, wants_log_probs: bool, missing: str, engine: str,
                           request_id: str):
    """``output.extra_fields["rollout_entropy"]``: one value per token, checked; log probs kept only if asked for.

    ``entropy`` None means the engine returned none: ``missing`` says why and what to do.
    """
    if entropy is None:
        raise RuntimeError(missing)
    if len(entropy) != len(output.token_ids):
        raise RuntimeError(
            f"{engine} returned {len(entropy)} entropy values for {len(output.token_ids)} tokens (request {request_id})"
        )
    output.extra_fields[ROLLOUT_ENTROPY] = list(entropy)
    if not wants_log_probs:
        output.log_probs = None
    return output
