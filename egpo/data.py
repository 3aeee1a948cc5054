"""Writes verl's RL parquet for the GPU recipes from GSM8K or MATH.

    python -m egpo.data gsm8k --out DIR                     # openai/gsm8k (main), train and test splits
    python -m egpo.data math --out DIR                      # DigitalLearningGmbH/MATH-lighteval, train and test
    python -m egpo.data gsm8k --input rows.jsonl --split train --out DIR   # a local file, same fields as the hub

Rows follow verl's own preprocessors (``examples/data_preprocess/gsm8k.py`` and ``math_dataset.py``): a chat
``prompt`` (the model's chat template is applied by verl's agent loop at rollout), ``ability`` math,
``reward_model.ground_truth`` (GSM8K: the number after ``####``, commas removed; MATH: the last ``\\boxed{}`` of
the solution) and a ``data_source`` that verl's default reward routes (``openai/gsm8k`` -> ``gsm8k.compute_score``;
``DigitalLearningGmbH/MATH-lighteval`` -> ``math_reward.compute_score``). Local files are JSON lines or parquet with
the hub's fields: ``question`` / ``answer`` (GSM8K), ``problem`` / ``solution`` (MATH).

A test split also gives ``{name}_val.parquet``: a fixed subset of it (``--val-rows``, default 500, drawn with a
fixed seed, the same for every run and seed of an ablation) for validation during training. Validating the whole
MATH test set (5,000 problems x 4 thinking-mode samples) every 20 steps costs more generations than training.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SETS = {
    "gsm8k": {
        "hub": ("openai/gsm8k", "main"),
        "data_source": "openai/gsm8k",
        "fields": ("question", "answer"),
        "instruction": 'Let\'s think step by step and output the final answer after "####".',
    },
    "math": {
        "hub": ("DigitalLearningGmbH/MATH-lighteval", None),
        "data_source": "DigitalLearningGmbH/MATH-lighteval",
        "fields": ("problem", "solution"),
        "instruction": "Let's think step by step and output the final answer within \\boxed{}.",
    },
}


def gsm8k_answer(answer: str) -> str:
    if "####" not in answer:
        raise ValueError(f"a GSM8K answer has no '####' final answer: {answer[-80:]!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def last_boxed(solution: str) -> str:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(solution.rfind("\\boxed"), solution.rfind("\\fbox"))
    if start < 0:
        raise ValueError(f"a MATH solution has no \\boxed answer: {solution[-80:]!r}")
    open_brace = solution.find("{", start)
    depth = 0
    for i in range(open_brace, len(solution)):
        depth += {"{": 1, "}": -1}.get(solution[i], 0)
        if depth == 0:
            return solution[open_brace + 1 : i]
    raise ValueError(f"unbalanced braces in a MATH answer: {solution[start:start + 80]!r}")


def to_rows(name: str, records: list[dict], split: str) -> list[dict]:
    spec = SETS[name]
    question_key, answer_key = spec["fields"]
    rows = []
    for i, record in enumerate(records):
        missing = [k for k in (question_key, answer_key) if k not in record]
        if missing:
            raise ValueError(f"{name} record {i} lacks {missing}; expected the hub's fields {spec['fields']}")
        question, answer = record[question_key], record[answer_key]
        truth = gsm8k_answer(answer) if name == "gsm8k" else last_boxed(answer)
        rows.append({
            "data_source": spec["data_source"],
            "prompt": [{"role": "user", "content": f"{question} {spec['instruction']}"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": i, "question": question, "answer": answer},
        })
    return rows


def read_local(path: Path) -> list[dict]:
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class HubUnreachable(SystemExit):
    """The hub cannot be reached and the data set is not in the datasets cache: one line, with ``--input``."""


def read_hub(name: str) -> dict[str, list[dict]]:
    """The data set's splits from the hub, or from the datasets cache where the hub cannot be reached (known within
    seconds: no retries); neither gives one line naming ``--input``."""
    import os

    from egpo.preflight.model_source import hub_unreachable

    repo, config = SETS[name]["hub"]
    unreachable = hub_unreachable()
    if unreachable:  # the cache only: datasets reads these at import
        os.environ["HF_DATASETS_OFFLINE"] = os.environ["HF_HUB_OFFLINE"] = "1"
    from datasets import load_dataset

    try:
        dataset = load_dataset(repo, config) if config else load_dataset(repo)
    except Exception as err:  # noqa: BLE001 - datasets raises several types for a missing cache
        if not unreachable:
            raise
        fields = " and ".join(SETS[name]["fields"])
        raise HubUnreachable(
            f"python -m egpo.data {name}: {unreachable} and {repo} is not in this machine's datasets cache "
            f"({type(err).__name__}). Save each split where the hub is reachable as JSON lines or parquet with the "
            f"fields {fields}, then: python -m egpo.data {name} --input FILE --split train --out DIR (and --split "
            "test)") from None
    return {split: list(dataset[split]) for split in dataset}


VAL_ROWS = 500
VAL_SEED = 0


def validation_subset(frame, rows: int):
    """``rows`` rows of a test split, drawn with a fixed seed (independent of any run's seed), in file order."""
    import numpy as np

    if rows >= len(frame):
        return frame
    keep = np.sort(np.random.default_rng(VAL_SEED).choice(len(frame), size=rows, replace=False))
    return frame.iloc[keep].reset_index(drop=True)


def write(name: str, out: Path, input_path: Path | None = None, split: str = "train",
          val_rows: int = VAL_ROWS) -> list[Path]:
    import pandas as pd

    splits = {split: read_local(input_path)} if input_path else read_hub(name)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for split_name, records in splits.items():
        frame = pd.DataFrame(to_rows(name, records, split_name))
        path = out / f"{name}_{split_name}.parquet"
        frame.to_parquet(path)
        written.append(path)
        if split_name == "test" and val_rows > 0:
            val_path = out / f"{name}_val.parquet"
            validation_subset(frame, val_rows).to_parquet(val_path)
            written.append(val_path)
    return written


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m egpo.data", description=__doc__.splitlines()[0],
                                     allow_abbrev=False)
    parser.add_argument("dataset", choices=sorted(SETS))
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--input", type=Path, default=None, help="a local .jsonl or .parquet with the hub's fields")
    parser.add_argument("--split", default="train", help="the split name of --input")
    parser.add_argument("--val-rows", type=int, default=VAL_ROWS,
                        help="rows of the test split in {name}_val.parquet (the recipes' validation set; 0: none)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    for path in write(args.dataset, args.out, args.input, args.split, args.val_rows):
        print(path)


if __name__ == "__main__":
    main()
