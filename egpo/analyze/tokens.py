"""A generation run's rows (``egpo.generate``'s parquet parts) as flat per-token arrays, read a part at a time.

Every response token is one element: its entropy, token id, row, position in the response and whether it lies in the
thinking span (egpo's own span rule, :func:`egpo.advantage.cot.compute_cot_mask`, with the run's ``<think>`` ids;
``None`` where the tokenizer has no markers); every row is one element of the per-row arrays (data-set index, sample
number, response length, score: NaN where none).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from egpo.runs.generation_rows import arrow_lists, padded
from egpo.runs.generation_store import iter_parts, read_run

PAD = -1  # never a token id: padding is never a thinking marker
READ = ["index", "sample", "prompt_ids", "response_ids", "entropy", "log_prob", "score"]  # not the texts


@dataclass
class RunTokens:
    name: str
    path: Path
    run: dict
    entropy: np.ndarray  # (T,) float64
    log_prob: np.ndarray  # (T,) float64
    token_id: np.ndarray  # (T,) int64
    row: np.ndarray  # (T,) int64: the row each token belongs to
    position: np.ndarray  # (T,) int64: its position in the response
    thought: np.ndarray | None  # (T,) bool: inside <think> ... </think>; None: the run has no thinking markers
    offsets: np.ndarray  # (R + 1,) the tokens of row r are offsets[r]:offsets[r + 1]
    index: np.ndarray  # (R,) data-set row
    sample: np.ndarray  # (R,)
    score: np.ndarray  # (R,) float64, NaN where the run has no reward

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def row_keys(self) -> np.ndarray:
        """(R,) one integer per row, the same for the same (index, sample) in any run: how two runs' rows pair."""
        return self.index * (1 << 20) + self.sample

    @property
    def rows(self) -> int:
        return len(self.index)

    def row_of(self, key: tuple[int, int]) -> int | None:
        """The row of response ``key`` (its prompt's index, its sample), None where the run has none."""
        found = np.flatnonzero((self.index == key[0]) & (self.sample == key[1]))
        return int(found[0]) if len(found) else None

    def row_means(self) -> np.ndarray:
        """Each response's mean token entropy (NaN for an empty response)."""
        sums = np.bincount(self.row, weights=self.entropy, minlength=self.rows)
        with np.errstate(invalid="ignore", divide="ignore"):
            return sums / self.lengths

    def thought_position(self) -> np.ndarray:
        """(T,) each thought token's relative position in its response's thought, in [0, 1); NaN outside it."""
        out = np.full(len(self.entropy), np.nan)
        if self.thought is None or not self.thought.any():
            return out
        inside = self.thought
        count = np.bincount(self.row[inside], minlength=self.rows)
        rank = np.cumsum(inside) - 1  # running count of thought tokens
        first = np.zeros(self.rows, dtype=np.int64)  # thought tokens before each row's first
        first[1:] = np.cumsum(count)[:-1]
        out[inside] = (rank[inside] - first[self.row[inside]]) / count[self.row[inside]]
        return out


def _thought_mask(prompt_ids, response_ids, start_id: int, end_id: int) -> np.ndarray:
    from egpo.advantage.cot import compute_cot_mask, prompt_ends_inside_think

    prompt_values, prompt_lengths = arrow_lists(prompt_ids)
    values, lengths = arrow_lists(response_ids)
    prompts, _ = padded(prompt_values, prompt_lengths, max(1, int(prompt_lengths.max(initial=0))), PAD, left=True)
    responses, mask = padded(values, lengths, max(1, int(lengths.max(initial=0))), PAD, left=False)
    inside = compute_cot_mask(responses, mask, start_id, end_id,
                              starts_inside=prompt_ends_inside_think(prompts, start_id, end_id))
    return inside[mask.bool()].numpy()  # row-major: the flat order of the tokens


def load_run(path: Path, name: str | None = None) -> RunTokens:
    path = Path(path)
    run = read_run(path)
    start_id, end_id = (run.get("think_token_ids") or [None, None])[:2]
    has_markers = start_id is not None and end_id is not None
    parts = {key: [] for key in ("entropy", "log_prob", "token_id", "lengths", "index", "sample", "score",
                                 "thought")}
    for _, table in iter_parts(path, columns=READ):
        entropy, lengths = arrow_lists(table.column("entropy"))
        ids, id_lengths = arrow_lists(table.column("response_ids"))
        log_prob, _ = arrow_lists(table.column("log_prob"))
        if not np.array_equal(lengths, id_lengths):
            raise ValueError(f"{path}: a row's entropy and response_ids differ in length")
        parts["entropy"].append(entropy.astype(np.float64))
        parts["log_prob"].append(log_prob.astype(np.float64))
        parts["token_id"].append(ids.astype(np.int64))
        parts["lengths"].append(lengths)
        parts["index"].append(table.column("index").to_numpy())
        parts["sample"].append(table.column("sample").to_numpy())
        parts["score"].append(table.column("score").to_numpy(zero_copy_only=False).astype(np.float64))
        if has_markers:
            parts["thought"].append(_thought_mask(table.column("prompt_ids"), table.column("response_ids"),
                                                  int(start_id), int(end_id)))
    joined = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in parts.items()}
    lengths = joined["lengths"].astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    row = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(offsets[-1]) - offsets[:-1][row] if len(row) else np.zeros(0, dtype=np.int64)
    return RunTokens(
        name=name or path.name, path=path, run=run, entropy=joined["entropy"], log_prob=joined["log_prob"],
        token_id=joined["token_id"].astype(np.int64), row=row, position=position,
        thought=joined["thought"].astype(bool) if has_markers else None, offsets=offsets,
        index=joined["index"].astype(np.int64), sample=joined["sample"].astype(np.int64), score=joined["score"])


def same_responses(a: RunTokens, b: RunTokens) -> bool:
    """Two runs hold the same responses (one scores the other's, or both score a third's)."""
    return a.run.get("responses_id") is not None and a.run.get("responses_id") == b.run.get("responses_id")


def aligned_order(run: RunTokens, keys: np.ndarray) -> np.ndarray:
    """The token permutation that lists ``run``'s tokens row by row in the order of ``keys`` (one per row, sorted
    ascending: index, sample)."""
    order = np.argsort(keys, kind="stable")
    starts, lengths = run.offsets[:-1][order], run.lengths[order]
    shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
    return np.arange(int(lengths.sum())) + shift


def prompt_texts(path: Path, keys: set[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The decoded prompt of each (index, sample) row in ``keys`` (the rows a page shows), read a part at a time."""
    found = {}
    for _, table in iter_parts(Path(path), columns=["index", "sample", "prompt"]):
        for index, sample, prompt in zip(*(table.column(c).to_pylist() for c in ("index", "sample", "prompt"))):
            if (index, sample) in keys:
                found[(index, sample)] = prompt
    return found


def reads_another_runs_tokens(run: RunTokens) -> bool:
    """A ``--score`` run: its entropy is of tokens another run sampled."""
    return run.run.get("fingerprint", {}).get("mode") == "score"
