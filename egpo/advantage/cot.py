"""The chain-of-thought span of a response: which response tokens lie inside `<think>` ... `</think>`.

Semantics (``docs`` and the estimator's contract):

* A span opens after a ``<think>`` token and closes before the next ``</think>``; the marker tokens
  themselves are never part of it. A repeated ``<think>`` inside a span does not nest, so the state at
  any position is simply the type of the last marker before it.
* A response may start inside a span (the prompt ended with an unclosed ``<think>``). ``starts_inside``
  gives that state per response; when it is ``None`` it is inferred: inside exactly when the response's
  first marker is ``</think>``.
* A span with no closing marker runs to the end of the valid response.
* Markers are recognised at every position of ``responses``, also where ``response_mask`` is 0: in
  multi-turn rollouts a turn's ``<think>`` can sit in template tokens the policy did not sample. Only
  positions with ``response_mask == 1`` are ever part of the span.

Everything is vectorized: markers are sparse, so the state changes are scattered at the marker positions
and integrated with one ``cumsum`` (int8) along the sequence.
"""

from __future__ import annotations

import torch

__all__ = ["compute_cot_mask", "prompt_ends_inside_think"]


def _check_2d(name: str, t: torch.Tensor, shape: torch.Size | None = None) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (batch, response_length); got shape {tuple(t.shape)}")
    if shape is not None and t.shape != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)} but responses has shape {tuple(shape)}")


def compute_cot_mask(
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    start_id: int,
    end_id: int,
    starts_inside: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean mask ``(bs, L)``: True where a valid response token lies strictly inside a thinking span.

    Args:
        responses: ``(bs, L)`` integer token ids, exactly as sampled.
        response_mask: ``(bs, L)`` 0/1 (any dtype) valid-token mask.
        start_id / end_id: token ids of ``<think>`` and ``</think>``.
        starts_inside: optional ``(bs,)`` bool, True where the response begins inside a span.
    """
    _check_2d("responses", responses)
    _check_2d("response_mask", response_mask, responses.shape)
    if start_id == end_id:
        raise ValueError(f"cot_start_token_id and cot_end_token_id must differ (both are {start_id})")
    bs, length = responses.shape

    is_marker = torch.eq(responses, start_id).logical_or_(torch.eq(responses, end_id))

    # Sparse list of markers, row-major (rows ascending, positions ascending within a row).
    rows, cols = is_marker.nonzero(as_tuple=True)
    marker_is_start = (responses[rows, cols] == start_id).to(torch.int8)
    first_in_row = torch.ones_like(rows, dtype=torch.bool)
    first_in_row[1:] = rows[1:] != rows[:-1]

    if starts_inside is None:
        # Inferred: inside exactly when the first marker is `</think>`; no marker -> outside.
        initial = torch.zeros(bs, dtype=torch.int8, device=responses.device)
        initial[rows[first_in_row]] = 1 - marker_is_start[first_in_row]
    else:
        if starts_inside.shape != (bs,):
            raise ValueError(f"starts_inside must have shape ({bs},); got {tuple(starts_inside.shape)}")
        initial = starts_inside.to(device=responses.device, dtype=torch.int8)

    # State after marker k is its type; the change it makes is type_k - type_{k-1} (type_{-1} = initial).
    previous = torch.empty_like(marker_is_start)
    previous[1:] = marker_is_start[:-1]
    previous[first_in_row] = initial[rows[first_in_row]]
    delta = torch.zeros((bs, length), dtype=torch.int8, device=responses.device)
    delta[rows, cols] = marker_is_start - previous

    inside = (delta.cumsum(dim=1, dtype=torch.int8) + initial.unsqueeze(1)).bool()
    return inside & ~is_marker & response_mask.bool()


def prompt_ends_inside_think(prompts: torch.Tensor, start_id: int, end_id: int) -> torch.Tensor:
    """``(bs,)`` bool: True where the prompt's last thinking marker is an unclosed ``<think>``.

    This is the ``starts_inside`` state of the response that follows the prompt (Qwen3-2507 "Thinking"
    templates end the prompt with ``<think>``). Padding is never a marker, so left padding is harmless.
    """
    if prompts.dim() != 2:
        raise ValueError(f"prompts must be 2-D (batch, prompt_length); got shape {tuple(prompts.shape)}")
    positions = torch.arange(1, prompts.shape[1] + 1, device=prompts.device)
    last_start = torch.where(prompts == start_id, positions, 0).amax(dim=1)
    last_end = torch.where(prompts == end_id, positions, 0).amax(dim=1)
    return last_start > last_end
