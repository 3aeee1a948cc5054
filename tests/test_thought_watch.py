"""A run that reads the thinking span of a model that never thinks says so once, naming egpo_span."""

from egpo.trainer.thought_watch import STEPS, NeverThinksWatch


def test_warns_once_after_consecutive_steps_without_a_span(capsys):
    watch = NeverThinksWatch(active=True)
    said = [watch.observe({"egpo/no_cot_frac": 1.0}, step) for step in range(1, STEPS)]
    assert said == [None] * (STEPS - 1)
    message = watch.observe({"egpo/no_cot_frac": 1.0}, STEPS)
    assert "algorithm.egpo_span=response" in message and f"up to step {STEPS}" in message
    assert message in capsys.readouterr().err
    assert all(watch.observe({"egpo/no_cot_frac": 1.0}, step) is None for step in range(STEPS + 1, 3 * STEPS))


def test_a_step_with_a_span_restarts_the_count():
    watch = NeverThinksWatch(active=True)
    fracs = [1.0] * (STEPS - 1) + [0.97] + [1.0] * (STEPS - 1)
    assert all(watch.observe({"egpo/no_cot_frac": f}, i) is None for i, f in enumerate(fracs))
    assert watch.observe({"egpo/no_cot_frac": 1.0}, len(fracs)) is not None


def test_silent_when_inactive_or_without_the_figure():
    inactive = NeverThinksWatch(active=False)  # egpo_span=response, or not egpo
    assert all(inactive.observe({"egpo/no_cot_frac": 1.0}, i) is None for i in range(3 * STEPS))
    watch = NeverThinksWatch(active=True)
    assert all(watch.observe({"egpo/bonus_mean": 0.0}, i) is None for i in range(3 * STEPS))
