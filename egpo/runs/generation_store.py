"""A generation run's folder: ``run.json``, ``samples/part-NNNNN.parquet``, ``done.json``.

Rows are written a part at a time, each part the rows of one chunk of prompts (chunk ``k`` is the data set's rows
``k * chunk`` to ``(k + 1) * chunk - 1``; a ``--score`` run's part ``k`` is its source's part ``k``). A part is
written to a temporary name and renamed, so a part file is whole or absent: a rerun after any interruption skips the
parts that exist and writes each row exactly once. ``run.json`` holds what decides the rows (the fingerprint); a
rerun into the same folder with other settings is refused instead of mixing two runs' rows.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from egpo.errors import EgpoConfigError
from egpo.runs.state import DONE, RUN

SAMPLES = "samples"
PART = "part-{:05d}.parquet"

# the columns every part has, in order; list columns hold one value per response token
COLUMNS = ("index", "sample", "prompt", "prompt_ids", "response_ids", "response", "entropy", "log_prob", "score")


class GenerationRunError(EgpoConfigError):
    """A folder that does not hold a generation run, or holds one with other settings."""


def part_path(out: Path, k: int) -> Path:
    return Path(out) / SAMPLES / PART.format(k)


@dataclass
class SampleStore:
    out: Path

    def __post_init__(self):
        self.out = Path(self.out)

    @property
    def samples(self) -> Path:
        return self.out / SAMPLES

    # ------------------------------------------------------------------ run.json
    def start(self, fingerprint: dict, details: dict) -> dict:
        """Create the folder or check that it holds this run; returns run.json's content. Leftover temporary parts of
        an interrupted write are removed."""
        self.samples.mkdir(parents=True, exist_ok=True)
        for leftover in self.samples.glob(".*.tmp"):
            leftover.unlink()
        run_file = self.out / RUN
        if run_file.exists() and not part_numbers(self.out) and not self.done():
            held = json.loads(run_file.read_text())
            if held.get("fingerprint", {}) != fingerprint:  # a run that wrote nothing holds nothing to keep
                print(f"[egpo] generate: {self.out} held a run with other settings that wrote no rows; it is "
                      "replaced by this one", flush=True)
                run_file.unlink()
        if run_file.exists():
            held = json.loads(run_file.read_text())
            before = held.get("fingerprint", {})
            if before != fingerprint:
                changed = sorted(k for k in set(before) | set(fingerprint) if before.get(k) != fingerprint.get(k))
                was = ", ".join(f"{k}: {before.get(k)!r} there, {fingerprint.get(k)!r} now" for k in changed)
                raise GenerationRunError(f"{self.out} holds a generation run with other settings ({was}); rerun its "
                                         "command to finish it, or give another --out")
            return held
        run = {"fingerprint": fingerprint, "responses_id": details.pop("responses_id", None) or uuid.uuid4().hex,
               **details}
        tmp = run_file.with_name(f".{RUN}.tmp")
        tmp.write_text(json.dumps(run, indent=1, default=str))
        os.replace(tmp, run_file)
        return run

    def run(self) -> dict:
        return read_run(self.out)

    # ------------------------------------------------------------------ parts
    def has_part(self, k: int) -> bool:
        return part_path(self.out, k).exists()

    def write_part(self, k: int, table) -> None:
        """Write ``table`` (a pyarrow Table with :data:`COLUMNS`) as part ``k``: whole or not at all."""
        import pyarrow.parquet as pq

        missing = [c for c in COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"a part needs the columns {COLUMNS}; this one lacks {missing}")
        final = part_path(self.out, k)
        tmp = final.with_name(f".{final.name}.tmp")
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)

    def response_tokens(self) -> int:
        """The response tokens of every written part."""
        import pyarrow.compute as pc

        return sum(int(pc.sum(pc.list_value_length(table.column("response_ids"))).as_py() or 0)
                   for _, table in iter_parts(self.out, columns=["response_ids"]))

    def finish(self, summary: dict) -> None:
        (self.out / DONE).write_text(json.dumps(summary, indent=1))

    def done(self) -> bool:
        return (self.out / DONE).exists()


def read_run(out: Path, recipe: str = '--config-path="$PWD/recipes" --config-name=cpu_warm') -> dict:
    """``out``'s run.json; where there is none, the refusal's fix makes one with ``recipe`` (the recipe options of
    the command that asked, or the CPU demo's)."""
    run_file = Path(out) / RUN
    if not run_file.exists():
        raise GenerationRunError(f"{out} holds no generation run ({RUN} is missing): make one with "
                                 f"python -m egpo.generate {recipe} --out {out}")
    return json.loads(run_file.read_text())


def read_done(out: Path) -> dict:
    done = Path(out) / DONE
    return json.loads(done.read_text()) if done.exists() else {}


def part_numbers(out: Path) -> list[int]:
    return sorted(int(p.name[len("part-"):-len(".parquet")]) for p in (Path(out) / SAMPLES).glob("part-*.parquet"))


def iter_parts(out: Path, columns: list[str] | None = None) -> Iterator[tuple[int, object]]:
    """``(k, table)`` for each written part, in order, one part in memory at a time."""
    import pyarrow.parquet as pq

    for k in part_numbers(out):
        yield k, pq.read_table(part_path(out, k), columns=columns)
