"""A rehearsal's events: what its schedule says will happen (the step-0 validation, training steps, saves, validations
on save steps, the last step's save), and whether the run's own files show each, with its seconds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from egpo.runs.state import TRAINING_STEP_KEY


@dataclass(frozen=True)
class Event:
    what: str  # validation | training step | save | validation on a save step
    step: int


def expected_events(config: DictConfig) -> list[Event]:
    """The events of ``config``'s schedule, in verl's order (a step saves, then it validates)."""
    trainer = config.trainer
    steps = int(trainer.total_training_steps)
    test, save = int(trainer.get("test_freq", -1) or -1), int(trainer.get("save_freq", -1) or -1)
    events = [Event("validation", 0)] if trainer.get("val_before_train", True) and test > 0 else []
    for step in range(1, steps + 1):
        events.append(Event("training step", step))
        saves = save > 0 and (step % save == 0 or step == steps)
        if saves:
            events.append(Event("save", step))
        if test > 0 and (step % test == 0 or step == steps):
            events.append(Event("validation on a save step" if saves else "validation", step))
    return events


def held(event: Event, steps: dict[int, dict], checkpoints: set[int], keep: int | None) -> tuple[bool | None, float | None]:
    """(whether the run shows ``event``, its seconds): None where its files cannot tell (a save verl's rotation
    removed since)."""
    data = steps.get(event.step, {})
    if event.what == "training step":
        return TRAINING_STEP_KEY in data, data.get(TRAINING_STEP_KEY)
    if event.what.startswith("validation"):
        shown = any(key.startswith("val-") for key in data)
        return shown, data.get("timing_s/testing")
    if event.step in checkpoints:
        return True, data.get("timing_s/save_checkpoint")
    newer = [s for s in checkpoints if s > event.step]
    if keep and len(newer) >= keep:
        return None, data.get("timing_s/save_checkpoint")  # rotated away by the keep
    return False, None


def report_lines(config: DictConfig, where: Path) -> tuple[list[str], bool]:
    """One line per event (event, step, held or not, seconds), and whether every event held."""
    from egpo.runs.state import checkpoint_steps, logged_steps

    steps = {s["step"]: s["data"] for s in logged_steps(where)}
    checkpoints = set(checkpoint_steps(where, where))
    keep = config.trainer.get("max_actor_ckpt_to_keep", None)
    lines, every = [], True
    for event in expected_events(config):
        shown, seconds = held(event, steps, checkpoints, int(keep) if keep else None)
        every &= shown is not False
        state = {True: "held", False: "NOT HELD", None: "rotated away (the keep)"}[shown]
        lines.append(f"[rehearse] {event.what:<27} step {event.step:>3}  {state}"
                     + (f"  {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""))
    return lines, every
