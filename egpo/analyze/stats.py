"""The numbers of the analysis: the token entropy distribution, its splits, the tokens, and two runs compared.

Percentiles are numpy's (linear interpolation); the 80th is the 80/20 rule's threshold (Wang et al., "Beyond the
80/20 Rule": the policy gradient on the tokens above it). A percentile's shift between two runs comes with a
bootstrap interval over responses (responses resampled with replacement, each with all its tokens; for two runs on
the same responses the same resample for both, a paired interval).
"""

from __future__ import annotations

import numpy as np

from egpo.analyze.tokens import RunTokens, aligned_order, reads_another_runs_tokens, same_responses

PERCENTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99)
BELOW = (0.01, 0.1)
THOUGHT_BINS = 10


def distribution(entropy: np.ndarray) -> dict:
    """Token count, mean, percentiles (keyed "10" ... "99"), the shares below 0.01 and 0.1 nats."""
    entropy = np.asarray(entropy, dtype=np.float64)
    if not len(entropy):
        return {"tokens": 0, "mean": None, "percentiles": {str(q): None for q in PERCENTILES},
                **{f"frac_below_{t}": None for t in BELOW}}
    values = np.percentile(entropy, PERCENTILES)
    return {"tokens": int(len(entropy)), "mean": float(entropy.mean()),
            "percentiles": {str(q): float(v) for q, v in zip(PERCENTILES, values)},
            **{f"frac_below_{t}": float((entropy < t).mean()) for t in BELOW}}


def _correlation(x: np.ndarray, y: np.ndarray) -> float | None:
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3 or np.std(x[keep]) == 0 or np.std(y[keep]) == 0:
        return None
    return float(np.corrcoef(x[keep], y[keep])[0, 1])


def token_table(run: RunTokens, min_count: int, top: int, decode) -> dict:
    """Mean entropy and count per token id (ids seen at least ``min_count`` times): the ``top`` highest and lowest,
    two lists that never share a token (with fewer than ``2 * top`` ids, the higher half and the lower half)."""
    if not len(run.token_id):
        return {"top_high": [], "top_low": [], "min_count": min_count}
    count = np.bincount(run.token_id)
    total = np.bincount(run.token_id, weights=run.entropy)
    ids = np.flatnonzero(count >= min_count)
    mean = total[ids] / count[ids]
    order = np.lexsort((ids, -mean))  # highest first, ties by id
    row = lambda i: {"token_id": int(ids[i]), "text": decode(int(ids[i])), "mean_entropy": float(mean[i]),  # noqa: E731
                     "count": int(count[ids[i]])}
    high = min(top, (len(ids) + 1) // 2)
    low = min(top, len(ids) - high)
    return {"min_count": min_count, "top_high": [row(i) for i in order[:high]],
            "top_low": [row(i) for i in order[::-1][:low]]}


def run_summary(run: RunTokens, solved_score: float, min_count: int, top: int, decode) -> dict:
    summary = {"name": run.name, "path": str(run.path), "mode": run.run.get("fingerprint", {}).get("mode"),
               "model": run.run.get("fingerprint", {}).get("model"),
               "checkpoint": run.run.get("fingerprint", {}).get("checkpoint"), "entropy_of": run.run.get("entropy"),
               "responses": run.rows, **distribution(run.entropy)}
    summary["thought"] = distribution(run.entropy[run.thought]) if run.thought is not None else None
    summary["answer"] = distribution(run.entropy[~run.thought]) if run.thought is not None else None
    scored = np.isfinite(run.score)
    if scored.any():
        correct_rows = scored & (run.score >= solved_score)
        incorrect_rows = scored & (run.score < solved_score)
        summary["correct"] = {"responses": int(correct_rows.sum()), **distribution(run.entropy[correct_rows[run.row]])}
        summary["incorrect"] = {"responses": int(incorrect_rows.sum()),
                                **distribution(run.entropy[incorrect_rows[run.row]])}
    else:
        summary["correct"] = summary["incorrect"] = None
    summary["solved_score"] = solved_score
    position = run.thought_position()
    inside = np.isfinite(position)
    if inside.any():
        bins = np.minimum((position[inside] * THOUGHT_BINS).astype(np.int64), THOUGHT_BINS - 1)
        count = np.bincount(bins, minlength=THOUGHT_BINS)
        total = np.bincount(bins, weights=run.entropy[inside], minlength=THOUGHT_BINS)
        with np.errstate(invalid="ignore", divide="ignore"):
            profile = total / count
        summary["thought_profile"] = {"bins": THOUGHT_BINS,
                                      "mean_entropy": [None if c == 0 else float(v) for v, c in zip(profile, count)],
                                      "tokens": count.tolist()}
    else:
        summary["thought_profile"] = None
    means = run.row_means()
    summary["per_response"] = {
        "mean_of_means": float(np.nanmean(means)) if np.isfinite(means).any() else None,
        "corr_mean_entropy_length": _correlation(means, run.lengths.astype(np.float64)),
        "corr_mean_entropy_score": _correlation(means, run.score),
    }
    summary.update(token_table(run, min_count, top, decode))
    return summary


# ---------------------------------------------------------------------- comparison
def percentile_shift(a: RunTokens, b: RunTokens, paired: bool, resamples: int, seed: int,
                     confidence: float = 0.95) -> dict:
    """``b`` minus ``a`` at each percentile and in the mean, with a percentile-bootstrap interval over responses: each
    resample draws responses with replacement, takes all their tokens, and computes the same numpy percentiles."""
    qs = np.array(PERCENTILES, dtype=np.float64)
    point = np.percentile(b.entropy, qs) - np.percentile(a.entropy, qs)
    mean_point = b.entropy.mean() - a.entropy.mean()
    rng = np.random.default_rng(seed)
    if paired:  # the same responses: one resample of response keys for both runs
        keys_a, keys_b = a.row_keys(), b.row_keys()
        b_rows_by_key = np.argsort(keys_b, kind="stable")
        a_to_b = b_rows_by_key[np.searchsorted(keys_b[b_rows_by_key], keys_a)]
    shifts, mean_shifts = [], []
    for _ in range(resamples):
        weights_a = np.bincount(rng.integers(0, a.rows, a.rows), minlength=a.rows)
        if paired:
            weights_b = np.zeros(b.rows, dtype=np.int64)
            weights_b[a_to_b] = weights_a
        else:
            weights_b = np.bincount(rng.integers(0, b.rows, b.rows), minlength=b.rows)
        sample_a = np.repeat(a.entropy, weights_a[a.row])
        sample_b = np.repeat(b.entropy, weights_b[b.row])
        shifts.append(np.percentile(sample_b, qs) - np.percentile(sample_a, qs))
        mean_shifts.append(sample_b.mean() - sample_a.mean())
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(np.array(shifts), [tail, 100 - tail], axis=0)
    mean_low, mean_high = np.percentile(np.array(mean_shifts), [tail, 100 - tail])
    return {"resamples": resamples, "confidence": confidence, "paired": paired,
            "mean": {"shift": float(mean_point), "low": float(mean_low), "high": float(mean_high)},
            "percentiles": {str(int(q)): {"shift": float(p), "low": float(lo), "high": float(hi)}
                            for q, p, lo, hi in zip(qs, point, low, high)}}


def token_moves(a: RunTokens, b: RunTokens, min_count: int, top: int, decode) -> list[dict]:
    """The tokens (seen ``min_count`` times in both runs) whose mean entropy moved most, largest move first."""
    size = int(max(a.token_id.max(initial=0), b.token_id.max(initial=0))) + 1
    count_a, count_b = np.bincount(a.token_id, minlength=size), np.bincount(b.token_id, minlength=size)
    ids = np.flatnonzero((count_a >= min_count) & (count_b >= min_count))
    mean_a = np.bincount(a.token_id, weights=a.entropy, minlength=size)[ids] / count_a[ids]
    mean_b = np.bincount(b.token_id, weights=b.entropy, minlength=size)[ids] / count_b[ids]
    shift = mean_b - mean_a
    order = np.lexsort((ids, -np.abs(shift)))[:top]
    return [{"token_id": int(ids[i]), "text": decode(int(ids[i])), "mean_entropy_a": float(mean_a[i]),
             "mean_entropy_b": float(mean_b[i]), "shift": float(shift[i]), "count_a": int(count_a[ids[i]]),
             "count_b": int(count_b[ids[i]])} for i in order]


def top20_overlap(a: RunTokens, b: RunTokens) -> dict:
    """Two runs on the same responses: of ``a``'s top-20% entropy positions (at or above its 80th percentile), the
    share that are in ``b``'s top 20% too (0.2 expected by chance)."""
    keys_a, keys_b = a.row_keys(), b.row_keys()
    if not np.array_equal(np.sort(keys_a), np.sort(keys_b)):
        raise ValueError(f"{a.name} and {b.name} do not hold the same responses (their index/sample rows differ)")
    order_a, order_b = aligned_order(a, keys_a), aligned_order(b, keys_b)
    if not np.array_equal(a.token_id[order_a], b.token_id[order_b]):
        raise ValueError(f"{a.name} and {b.name} hold different response tokens for the same rows")
    ea, eb = a.entropy[order_a], b.entropy[order_b]
    top_a, top_b = ea >= np.percentile(ea, 80), eb >= np.percentile(eb, 80)
    return {"positions": int(len(ea)), "top_a": int(top_a.sum()), "top_b": int(top_b.sum()),
            "both": int((top_a & top_b).sum()), "overlap": float((top_a & top_b).sum() / max(1, top_a.sum())),
            "chance": 0.2}


def compare(a: RunTokens, b: RunTokens, *, resamples: int, seed: int, min_count: int, top: int, decode) -> dict:
    paired = same_responses(a, b)
    result = {"a": a.name, "b": b.name, "paired": paired,
              "entropy_of": {a.name: a.run.get("entropy"), b.name: b.run.get("entropy")},
              "shift": percentile_shift(a, b, paired, resamples, seed),
              "token_moves": token_moves(a, b, min_count, top, decode),
              "top20_overlap": top20_overlap(a, b) if paired else None,
              # one of them read the other's tokens (egpo.generate --score): a shift of reading, not of sampling
              "scored": paired and (reads_another_runs_tokens(a) or reads_another_runs_tokens(b))}
    result["same_entropy_definition"] = entropy_distribution(a.run.get("entropy")) == \
        entropy_distribution(b.run.get("entropy"))
    return result


def entropy_distribution(definition: dict | None) -> tuple | None:
    """Which distribution a run's entropy is of: (top-k, the temperature its logits were divided by); raw logits and
    ``logits / temperature`` at temperature 1 are the same."""
    if not definition:
        return None
    scaled = "temperature" in str(definition.get("of", ""))
    return int(definition.get("top_k", 0)), float(definition.get("temperature", 1.0)) if scaled else 1.0
