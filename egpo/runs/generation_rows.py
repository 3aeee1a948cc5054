"""A chunk's padded tensors -> one part's rows (a pyarrow Table with the store's columns), without a loop over tokens.

The tokens of each row are those its attention mask marks: the prompt's (left-padded in ``prompts``) and the
response's (right-padded in ``responses``), exactly what the engine saw and gave; ``entropy`` and ``log_prob`` are
taken at the response's tokens, one value each.
"""

from __future__ import annotations

import numpy as np
import torch


def ragged(values: torch.Tensor, mask: torch.Tensor, pa_type):
    """A pyarrow list column: row ``i`` holds ``values[i][mask[i]]``, in order."""
    import pyarrow as pa

    mask = mask.bool()
    lengths = mask.sum(dim=1).numpy()
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = values[mask].numpy()  # row-major: each row's values in order, rows one after the other
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=pa_type))


def sample_numbers(index: np.ndarray) -> np.ndarray:
    """Each row's number among the consecutive rows of its data-set row (0 .. n - 1)."""
    n = len(index)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.r_[True, index[1:] != index[:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(n), 0))
    return np.arange(n) - first


def rows_table(*, index: np.ndarray, prompts: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor,
               response_mask: torch.Tensor, entropy: torch.Tensor, log_prob: torch.Tensor, scores, tokenizer,
               sample: np.ndarray | None = None):
    """The store's columns for one chunk. ``scores``: one float per row (a pyarrow array keeps its nulls), or None
    where no reward function ran."""
    import pyarrow as pa

    from egpo.runs.generation_store import COLUMNS

    index = np.asarray(index, dtype=np.int64)
    prompt_ids = ragged(prompts.cpu(), prompt_mask.cpu(), pa.int32())
    response_ids = ragged(responses.cpu(), response_mask.cpu(), pa.int32())
    decode = lambda ids: tokenizer.batch_decode(ids.to_pylist(), skip_special_tokens=False)  # noqa: E731
    columns = {
        "index": pa.array(index),
        "sample": pa.array(sample_numbers(index) if sample is None else np.asarray(sample, dtype=np.int64)),
        "prompt": pa.array(decode(prompt_ids), type=pa.string()),
        "prompt_ids": prompt_ids,
        "response_ids": response_ids,
        "response": pa.array(decode(response_ids), type=pa.string()),
        "entropy": ragged(entropy.float().cpu(), response_mask.cpu(), pa.float32()),
        "log_prob": ragged(log_prob.float().cpu(), response_mask.cpu(), pa.float32()),
        "score": (pa.nulls(len(index), pa.float64()) if scores is None else scores.cast(pa.float64())
                  if isinstance(scores, (pa.Array, pa.ChunkedArray)) else pa.array(np.asarray(scores, dtype=np.float64))),
    }
    return pa.table({name: columns[name] for name in COLUMNS})


def arrow_lists(column) -> tuple[np.ndarray, np.ndarray]:
    """A pyarrow list column -> (all values in order, each row's length), as numpy."""
    array = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    return array.values.to_numpy(zero_copy_only=False), np.diff(array.offsets.to_numpy())


def padded(values, lengths, width: int, pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows given as their values one after the other and their lengths -> ``(ids, mask)`` of ``(rows, width)``,
    left- or right-padded with ``pad``."""
    lengths = torch.as_tensor(np.asarray(lengths), dtype=torch.long)
    if len(lengths) and int(lengths.max()) > width:
        raise ValueError(f"a row has {int(lengths.max())} tokens, more than the width {width}")
    cols = torch.arange(width)
    mask = (cols >= width - lengths[:, None]) if left else (cols < lengths[:, None])
    ids = torch.full((len(lengths), width), pad, dtype=torch.long)
    ids[mask] = torch.from_numpy(np.array(values, dtype=np.int64))  # a copy: arrow buffers are read-only
    return ids, mask.long()
