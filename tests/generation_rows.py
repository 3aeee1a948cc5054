"""Generation runs written by hand (egpo.generate's folder and parquet parts), for the analysis and report tests."""

import numpy as np
import pyarrow as pa

from egpo.runs.generation_store import COLUMNS, SampleStore

START, END = 3, 4  # the runs' <think> and </think> ids


def write_run(out, rows, responses_id=None, think=(START, END), parts=2, entropy_of=None):
    """rows: dicts with index, sample, prompt_ids, response_ids, entropy, score; written as ``parts`` parts."""
    store = SampleStore(out)
    store.start({"mode": "generate", "model": "none", "out": str(out)},
                {"responses_id": responses_id, "think_token_ids": list(think), "tokenizer": None,
                 "entropy": entropy_of or {"of": "logits", "temperature": 1.0, "top_k": 0}})
    for k, chunk in enumerate(np.array_split(np.arange(len(rows)), parts)):
        part = [rows[i] for i in chunk]
        columns = {c: [r.get(c) for r in part] for c in COLUMNS}
        columns["prompt"] = columns["response"] = ["" for _ in part]
        columns["log_prob"] = [[-h for h in r["entropy"]] for r in part]
        table = pa.table({
            "index": pa.array(columns["index"], pa.int64()), "sample": pa.array(columns["sample"], pa.int64()),
            "prompt": pa.array(columns["prompt"]), "prompt_ids": pa.array(columns["prompt_ids"], pa.list_(pa.int32())),
            "response_ids": pa.array(columns["response_ids"], pa.list_(pa.int32())),
            "response": pa.array(columns["response"]),
            "entropy": pa.array(columns["entropy"], pa.list_(pa.float32())),
            "log_prob": pa.array(columns["log_prob"], pa.list_(pa.float32())),
            "score": pa.array(columns["score"], pa.float64())})
        store.write_part(k, table)
    store.finish({"rows": len(rows)})
    return out


def random_rows(seed, n_rows=40, vocab=30):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_rows):
        length = int(rng.integers(1, 25))
        ids = rng.integers(5, vocab, length)
        if rng.random() < 0.7:  # a thought that closes somewhere
            ids[int(rng.integers(0, length))] = END
        if rng.random() < 0.3:
            ids[0] = START
        entropy = rng.gamma(0.3, 1.0, length).astype(np.float32)  # most tokens near zero, a long tail
        rows.append({"index": i // 2, "sample": i % 2, "prompt_ids": [1, 2, START] if rng.random() < 0.5 else [1, 2],
                     "response_ids": ids.tolist(), "entropy": entropy.tolist(),
                     "score": None if rng.random() < 0.1 else float(rng.integers(0, 2))})
    return rows
