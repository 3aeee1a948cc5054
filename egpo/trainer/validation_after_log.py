"""A save step's validation runs after the step is logged, so a checkpoint never outlives its step's metrics.

verl's ``RayPPOTrainer.fit`` saves a step's checkpoint, pushes the new weights to the rollout, validates, and only
then logs the step. The validation is the longest stretch of a step (a whole validation set's generations), and a run
killed in it held a checkpoint whose step was logged nowhere: resumed from that checkpoint, the step's metrics and
validation were lost for good; rolled back to the checkpoint before, a whole save interval was trained again.

At a step that saved, egpo's trainer answers verl's in-step ``_validate`` with nothing and runs the validation right
after verl's logger wrote the step, logging it at the same step (a second line; every reader merges a step's lines:
:func:`egpo.runs.state.logged_steps`). The weights are the same (verl pushed them before it would have validated),
so are the validation's figures; only the step's ``timing_s/step`` no longer holds the validation's time (its own
``timing_s/testing`` line does). A checkpoint then counts once its step is logged (:func:`egpo.runs.state.resume_point`),
and a run killed during that validation resumes from the checkpoint, validating at it before it trains
(:func:`egpo.runs.state.validation_owed`): nothing is trained twice and nothing is lost.

verl's logger is built inside ``fit`` (``from verl.utils.tracking import Tracking``), so its ``log`` is wrapped
(:data:`TRACKING_LOG`), acting only for the trainer that registered itself in this process.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from egpo.patching import Patch
from egpo.runs.state import validation_owed_marker

_active: dict = {"deferred": None}  # this process's trainer's DeferredValidation (one trainer per task runner)


class DeferredValidation:
    """Which step saved, and whose validation is owed until its log. While it is owed, the step's checkpoint folder
    says so (:data:`egpo.runs.state.VALIDATION_OWED`): a run stopped before it was logged validates there first when
    it resumes."""

    def __init__(self, validate, checkpoints: Path):
        self.validate = validate  # the trainer's own _validate (verl's, with egpo's pass@k)
        self.checkpoints = Path(checkpoints)  # verl's trainer.default_local_dir
        self.saved_at: int | None = None
        self.owed: int | None = None
        self.running = False

    def marker(self, step: int) -> Path:
        return validation_owed_marker(self.checkpoints, step)

    def saved(self, step: int) -> None:
        self.saved_at = step

    def defers(self, step: int) -> bool:
        """verl's in-step validation at a step that saved: owed until the step is logged."""
        if self.running or step != self.saved_at:
            return False
        self.owed = step
        if self.marker(step).parent.is_dir():
            self.marker(step).write_text(f"{step}\n")
        return True

    def validated(self, step: int) -> None:
        """A validation at ``step`` finished: what was owed there is paid (a resumed attempt's, before training)."""
        self.marker(step).unlink(missing_ok=True)

    def after_log(self, tracking, step: int) -> None:
        if self.owed != step or self.running:
            return
        self.running = True
        try:
            held = os.environ.get(HOLD_VALIDATION_AT)
            if held is not None and held.strip() == str(step):  # egpo.rehearse's kill lands inside the validation
                time.sleep(HOLD_S)
            started = time.perf_counter()
            metrics = dict(self.validate())
            metrics["timing_s/testing"] = time.perf_counter() - started
            tracking.log(data=metrics, step=step)
            self.validated(step)
        finally:
            self.running, self.owed = False, None


# ``python -m egpo.rehearse`` kills a run during a save step's validation, as a lost node would: it sets this to the
# step in the attempt it kills, whose validation then starts after HOLD_S seconds (the kill comes within a poll of the
# step's line, never after the validation, however fast the validation and however loaded the machine); a run the kill
# does not reach goes on after them. Never set otherwise.
HOLD_VALIDATION_AT = "EGPO_REHEARSE_HOLD_VALIDATION_AT"
HOLD_S = 30.0


def _log_then_validate(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    deferred = _active["deferred"]
    step = kwargs.get("step", args[1] if len(args) > 1 else None)
    if deferred is not None and step is not None:
        deferred.after_log(self, step)
    return result


TRACKING_LOG = Patch("verl.utils.tracking:Tracking.log", _log_then_validate)


def install(deferred: DeferredValidation) -> None:
    """In the trainer's process: the logger's wrapper in place, acting for ``deferred``."""
    _active["deferred"] = deferred
    TRACKING_LOG.apply()
