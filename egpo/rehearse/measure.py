"""What a rehearsal measures of its run while the run goes on: the checkpoints on disk at their peak (every file of
the run folder's ``global_step_N`` folders, sampled twice a second on a thread of the rehearsal's own), beside the
preflight's figure for the same configuration."""

from __future__ import annotations

import threading
from pathlib import Path

SAMPLE_SECONDS = 0.5


def checkpoints_on_disk(where: Path) -> tuple[int, int]:
    """(checkpoint folders, their bytes) in the run folder now; a file verl removes while it is read is not counted."""
    folders, size = 0, 0
    for folder in where.glob("global_step_*"):
        folders += 1
        for path in folder.rglob("*"):
            try:
                if path.is_file():
                    size += path.stat().st_size
            except OSError:
                pass
    return folders, size


class DiskPeak:
    """The most the run's checkpoints held on disk at once while the ``with`` block ran: ``folders`` and ``size`` at
    the sample with the most bytes."""

    def __init__(self, where: Path, every: float = SAMPLE_SECONDS):
        self.where, self.every = where, every
        self.folders, self.size = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rehearse-disk", daemon=True)

    def sample(self) -> None:
        folders, size = checkpoints_on_disk(self.where)
        if size > self.size:
            self.folders, self.size = folders, size

    def _watch(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def __enter__(self) -> "DiskPeak":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def disk_line(config, where: Path, peak: DiskPeak) -> str:
    """The checkpoints' peak on disk beside the preflight's (its count and size per checkpoint, for the rehearsal's
    own configuration)."""
    from egpo.preflight.scale import checkpoint_bytes, checkpoints_held, gb, model_shape

    shape = model_shape(config)
    held = checkpoints_held(config, int(config.trainer.total_training_steps))
    if shape is None or held is None or not peak.size:
        return "[rehearse] disk: no checkpoint seen, nothing to compare"
    predicted = held[1] * checkpoint_bytes(config, shape)
    ratio = peak.size / predicted if predicted else float("nan")
    return (f"[rehearse] disk at its peak: {peak.folders} checkpoint(s), {gb(peak.size)} on disk; the preflight's "
            f"{held[1]} checkpoint(s), {gb(predicted)} ({ratio:.2f}x)")


def driver_line(config, where: Path) -> tuple[str, bool]:
    """The driver's step batch as the run held it at the advantage, at its largest over the run's steps (the sizes its
    tensors logged, egpo's keys among them), beside the preflight's figures for the same configuration: verl's step
    batch (the head's figure on a cluster, ``step_batch_bytes``), and egpo's part, which must stay within the
    preflight's 'driver' line (a bound: it also counts the transients of the step's egpo functions). Whether egpo's
    part held."""
    from egpo.keys import EGPO_BATCH_BYTES, STEP_BATCH_BYTES
    from egpo.preflight.scale import egpo_driver_bytes, gb, step_batch_bytes
    from egpo.runs.state import logged_steps
    from egpo.settings import EgpoSettings

    steps = [line["data"] for line in logged_steps(where)]
    batch = max((d[STEP_BATCH_BYTES] for d in steps if STEP_BATCH_BYTES in d), default=None)
    ours = max((d[EGPO_BATCH_BYTES] for d in steps if EGPO_BATCH_BYTES in d), default=None)
    if batch is None:
        return "[rehearse] driver: no step logged its batch's size, nothing to compare", True
    verl = step_batch_bytes(config)
    bound = egpo_driver_bytes(config, EgpoSettings.from_algorithm(config.algorithm))
    held = ours <= bound
    return (f"[rehearse] driver: the step batch at the advantage at its largest {gb(batch)} ({batch:,.0f} B), the "
            f"preflight's {gb(verl)} ({batch / verl:.2f}x); egpo's keys in it {ours:,.0f} B, within the preflight's "
            f"'driver' line ({bound:,} B)" + ("" if held else "  NOT HELD")), held
