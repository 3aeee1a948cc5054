"""The data a run reads: files present, rows, and (with a tokenizer) prompt lengths against ``max_prompt_length``.

Prompt lengths are measured as verl's ``RLHFDataset`` measures them when it filters: the chat template applied with
``add_generation_prompt=True`` and ``data.apply_chat_template_kwargs``, tokenized.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from egpo.preflight.findings import Finding, error, fact, warning
from egpo.preflight.paths import data_paths, is_local

DATA_FIX = "python -m egpo.data math --out data (or gsm8k; docs/gpu.md, 'The GPU recipe set')"


@dataclass
class SplitData:
    key: str  # data.train_files / data.val_files
    paths: list[str]
    rows: int | None = None  # None: unknown (a remote file, or a format without a row count here)
    missing: tuple[str, ...] = ()


def parquet_rows(path: str) -> int | None:
    if not path.endswith(".parquet"):
        return None
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def inspect_split(config, key: str) -> SplitData:
    split = SplitData(key, data_paths(config, key))
    rows, missing = 0, []
    for path in split.paths:
        if not is_local(path):
            rows = None
            continue
        if not os.path.exists(path):
            missing.append(path)
            continue
        count = parquet_rows(path)
        rows = None if (rows is None or count is None) else rows + count
    split.missing = tuple(missing)
    split.rows = None if missing else rows
    return split


def run_splits(config) -> list[SplitData]:
    """The splits a run reads at start-up: ``data.train_files`` always, ``data.val_files`` where it is set."""
    train, val = inspect_split(config, "data.train_files"), inspect_split(config, "data.val_files")
    return [train, val] if val.paths else [train]


def file_findings(split: SplitData) -> list[Finding]:
    if not split.paths:
        return [error("data", f"{split.key} is not set; {DATA_FIX}")]
    if split.missing:
        return [error("data", f"{split.key}: {', '.join(split.missing)} not found; {DATA_FIX}, or point {split.key} "
                              "at your files")]
    shown = ", ".join(split.paths)
    rows = "rows not counted (not a local parquet file)" if split.rows is None else f"{split.rows} rows"
    return [fact("data", f"{split.key}: {shown}: {rows}")]


def split_findings(config, tokenizer=None) -> tuple[list[Finding], dict[str, int | None]]:
    """The data files of each split a run reads, and the rows it will train and validate on (data key -> rows, None:
    unknown); with a tokenizer, the prompt lengths and the rows verl's filter keeps."""
    findings: list[Finding] = []
    rows: dict[str, int | None] = {}
    for split in run_splits(config):
        findings += file_findings(split)
        rows[split.key] = split.rows
        if tokenizer is not None:
            lengths, kept = prompt_length_findings(config, split, tokenizer)
            findings += lengths
            if kept is not None:
                rows[split.key] = kept
    return findings, rows


def data_findings(config, run) -> list[Finding]:
    """:func:`split_findings` as a step of the pass: the rows into ``run.rows``, with the tokenizer ``python -m
    egpo.preflight`` read."""
    findings, rows = split_findings(config, run.tokenizer)
    run.rows.update(rows)
    return findings


def prompt_lengths(config, split: SplitData, tokenizer) -> list[int]:
    """Token count of every prompt in the split's files, as verl's dataset counts it."""
    import pandas as pd

    data = config.data
    key = data.get("prompt_key", "prompt")
    kwargs = dict(data.get("apply_chat_template_kwargs", None) or {})
    for drop in ("tokenize", "return_dict", "return_tensors"):
        kwargs.pop(drop, None)
    lengths = []
    for path in split.paths:
        prompts = pd.read_parquet(path, columns=[key])[key]
        conversations = [[dict(m) for m in messages] for messages in prompts]
        texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False, **kwargs)
        lengths += [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return lengths


def prompt_length_findings(config, split: SplitData, tokenizer) -> tuple[list[Finding], int | None]:
    """Findings, and the rows verl keeps after ``filter_overlong_prompts`` (None when not measured)."""
    if split.missing or not split.paths or not all(is_local(p) and p.endswith(".parquet") for p in split.paths):
        return [], None
    data = config.data
    limit = int(data.max_prompt_length)
    lengths = prompt_lengths(config, split, tokenizer)
    over = sum(n > limit for n in lengths)
    longest = max(lengths, default=0)
    findings = [fact("prompts", f"{split.key}: longest prompt {longest} tokens (data.max_prompt_length={limit}), "
                                f"{over} of {len(lengths)} longer")]
    kept = len(lengths)
    if over:
        if data.get("filter_overlong_prompts", True):
            kept -= over
            findings.append(warning("prompts", f"{split.key}: {over} of {len(lengths)} prompts are dropped by "
                                               f"data.filter_overlong_prompts; keep them with "
                                               f"data.max_prompt_length={longest}"))
        elif data.get("truncation", "error") == "error":
            findings.append(error("prompts", f"{split.key}: {over} prompts exceed data.max_prompt_length={limit} and "
                                             "data.truncation=error stops the run when the first is drawn; set "
                                             f"data.max_prompt_length={longest} or data.filter_overlong_prompts=true"))
        else:
            findings.append(warning("prompts", f"{split.key}: {over} prompts are truncated "
                                               f"(data.truncation={data.truncation})"))
    return findings, kept
