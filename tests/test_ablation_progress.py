"""The ablation's progress lines: where a training run is (its step, seconds per step, time left) at each tenth of
its steps and at least every few minutes, and a generation's own progress bar, read from what each already writes."""

from egpo.ablation.progress import StepProgress, generation_progress


def lines_for(steps, seconds_per_step, total, every_s=300.0, validation_s=20.0):
    said = []
    progress = StepProgress("[ablation] 1/4 grpo__seed0", total, started=0.0,
                            echo=lambda line, flush=False: said.append(line), every_s=every_s)
    progress({"step": 0, "data": {"val-egpo/pass@1": 0.1}}, validation_s)
    for step in steps:
        progress({"step": step, "data": {"timing_s/step": seconds_per_step, "critic/score/mean": 0.5}},
                 validation_s + 10.0 + (step - steps[0]) * seconds_per_step)
    return said


def test_a_line_at_each_tenth_of_the_steps_with_the_pace_and_the_time_left():
    said = lines_for(range(1, 31), 4.0, 30)
    assert said[0] == "[ablation] 1/4 grpo__seed0: validation before training done, 20 s after the start"
    assert said[1] == "[ablation] 1/4 grpo__seed0: step 1/30, 30 s for the load, the first validation and this step"
    # every third step (a tenth of 30), 4 s a step from the first on: step 4 leaves 26 steps, 104 s
    assert said[2] == "[ablation] 1/4 grpo__seed0: step 4/30, 4.0 s/step, 1m44s left"
    assert [line.split("step ")[1].split("/")[0] for line in said[1:]] == [str(s) for s in range(1, 31, 3)] + ["30"]
    assert said[-1].endswith("step 30/30, 4.0 s/step, 0s left")


def test_slow_steps_show_at_least_every_few_minutes():
    said = lines_for(range(1, 201), 200.0, 200)  # 20 steps a tenth, 200 s a step: a line every other step
    steps = [int(line.split("step ")[1].split("/")[0]) for line in said[1:]]
    assert steps[:4] == [1, 3, 5, 7] and "200.0 s/step, 10h" in said[2]


def test_a_resumed_attempt_counts_its_pace_from_its_own_first_step():
    said = lines_for(range(21, 31), 2.0, 30)
    assert said[1].endswith("step 21/30, 30 s for the load, the first validation and this step")
    assert said[2] == "[ablation] 1/4 grpo__seed0: step 24/30, 2.0 s/step, 12s left"


def test_generates_own_bar_is_read_through_rays_prefix():
    line = "\x1b[36m(GenerateTaskRunner pid=20179)\x1b[0m [egpo] generate [##########----------] 32/64 samples, " \
           "29 tok/s, 16s left\n"
    assert generation_progress(line) == "[##########----------] 32/64 samples, 29 tok/s, 16s left"
    assert generation_progress("(GenerateTaskRunner pid=1) [egpo] score [####################] 64/64 samples, "
                               "485 tok/s, 0s left") == "[####################] 64/64 samples, 485 tok/s, 0s left"
    assert generation_progress("[egpo] generate: 64 samples (916 response tokens) in 17s this attempt") is None
