"""A save step's validation runs after verl logs the step (egpo.trainer.validation_after_log): the order verl's fit
calls things in, replayed against the real wrapper of verl's logger; the resume it makes possible is
tests/test_run_state.py's and, end to end, tests/test_main_cpu.py's."""

import pytest
from verl.utils.tracking import Tracking

from egpo.runs.state import VALIDATION_OWED
from egpo.trainer import validation_after_log
from egpo.trainer.validation_after_log import TRACKING_LOG, DeferredValidation


class Logger(Tracking):
    """verl's Tracking with its backends left out: each line as logged."""

    def __init__(self):
        self.lines = []

    def log(self, data, step, backend=None):
        self.lines.append((step, dict(data)))


@pytest.fixture
def deferred(tmp_path):
    calls = []
    (tmp_path / "global_step_2").mkdir()
    found = DeferredValidation(lambda: calls.append("validate") or {"val-core/acc": 0.5}, tmp_path)
    TRACKING_LOG.remove()
    original = Tracking.log
    Tracking.log = Logger.log  # the wrapper goes around what verl's logger does, here: keep the line
    try:
        validation_after_log.install(found)
        yield found, calls
    finally:
        TRACKING_LOG.remove()
        Tracking.log = original
        validation_after_log._active["deferred"] = None


def fit_step(deferred, logger, step, saves, validates, kill_in_validation=False):
    """What verl's fit does in one step, in its order: save, validate, log."""
    if saves:
        deferred.saved(step)
    metrics = {"timing_s/step": 1.0}
    if validates and not deferred.defers(step):
        metrics.update(deferred.validate())
    if kill_in_validation:
        deferred.validate = lambda: (_ for _ in ()).throw(KeyboardInterrupt("killed"))
        with pytest.raises(KeyboardInterrupt):
            Tracking.log(logger, data=metrics, step=step)
        return
    Tracking.log(logger, data=metrics, step=step)


def test_a_save_steps_validation_comes_after_its_log_at_the_same_step(deferred, tmp_path):
    found, calls = deferred
    logger = Logger()
    fit_step(found, logger, 1, saves=False, validates=True)  # no save: verl's order, one line
    assert logger.lines == [(1, {"timing_s/step": 1.0, "val-core/acc": 0.5})]
    fit_step(found, logger, 2, saves=True, validates=True)
    assert logger.lines[1] == (2, {"timing_s/step": 1.0})  # the training line first, the validation's after it
    assert logger.lines[2][0] == 2 and logger.lines[2][1]["val-core/acc"] == 0.5
    assert "timing_s/testing" in logger.lines[2][1] and calls == ["validate", "validate"]
    assert not (tmp_path / "global_step_2" / VALIDATION_OWED).exists()  # paid
    fit_step(found, logger, 3, saves=False, validates=False)
    assert logger.lines[3] == (3, {"timing_s/step": 1.0}) and len(logger.lines) == 4


def test_a_run_stopped_in_that_validation_leaves_its_step_logged_and_the_validation_owed(deferred, tmp_path):
    found, _ = deferred
    logger = Logger()
    fit_step(found, logger, 2, saves=True, validates=True, kill_in_validation=True)
    assert logger.lines == [(2, {"timing_s/step": 1.0})]
    assert (tmp_path / "global_step_2" / VALIDATION_OWED).exists()
    found.validated(2)  # the resumed attempt's validation before training
    assert not (tmp_path / "global_step_2" / VALIDATION_OWED).exists()


def test_the_rehearsal_holds_the_validation_of_the_step_it_kills_in_and_no_other(deferred, tmp_path, monkeypatch):
    """egpo.rehearse names the step whose validation its kill must land in: that validation starts after a hold
    (the step's line and the owed marker already written), every other step's at once."""
    found, calls = deferred
    logger = Logger()
    slept = []
    monkeypatch.setattr(validation_after_log.time, "sleep", slept.append)
    monkeypatch.setenv(validation_after_log.HOLD_VALIDATION_AT, "4")
    fit_step(found, logger, 2, saves=True, validates=True)
    assert slept == [] and calls == ["validate"]
    (tmp_path / "global_step_4").mkdir()

    def validate_while_held():
        assert slept == [validation_after_log.HOLD_S]  # held before it began
        assert logger.lines[-1] == (4, {"timing_s/step": 1.0})  # the step's line written
        assert (tmp_path / "global_step_4" / VALIDATION_OWED).exists()  # and the validation marked owed
        return {"val-core/acc": 0.5}

    found.validate = validate_while_held
    fit_step(found, logger, 4, saves=True, validates=True)
    assert logger.lines[-1][0] == 4 and logger.lines[-1][1]["val-core/acc"] == 0.5
