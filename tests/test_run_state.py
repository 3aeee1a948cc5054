"""A run directory's state across attempts (egpo.runs.state), by hand-made files: what an attempt keeps of the one that
died, each step once, the checkpoints kept, the status a run shows, and what the report leaves out."""

import json
import os
import subprocess
import sys

import pytest

from egpo.runs.state import (ATTEMPT, ATTEMPT_METRICS, CHECKPOINTS, DONE, LATEST, METRICS_FILE, RUN, begin_attempt,
                            checkpoint_steps, end_attempt, logged_steps, prune_checkpoints, read_steps, run_status)


def write_steps(path, steps, value=0.0):
    path.write_text("".join(json.dumps({"step": s, "data": {"critic/score/mean": value + s}}) + "\n" for s in steps))


def checkpoint(work, *steps):
    root = work / CHECKPOINTS
    for s in steps:
        (root / f"global_step_{s}" / "actor").mkdir(parents=True, exist_ok=True)
    (root / LATEST).write_text(str(max(steps)))


def test_an_attempt_keeps_the_steps_up_to_the_checkpoint_it_resumes_from(tmp_path):
    """Attempt 1 logged steps 1-5 and died in step 6; its last checkpoint is step 4: the next attempt resumes from 4
    and logs 5 again, so the dead attempt's step 5 is dropped, and steps 1-4 are kept, once each."""
    write_steps(tmp_path / ATTEMPT_METRICS, [1, 2, 3, 4, 5])
    checkpoint(tmp_path, 2, 4)
    resume, path = begin_attempt(tmp_path)
    assert resume == 4 and path == tmp_path / ATTEMPT_METRICS and not path.exists()
    assert [s["step"] for s in read_steps(tmp_path / METRICS_FILE)] == [1, 2, 3, 4]
    write_steps(path, [5, 6, 7], value=100.0)  # the new attempt's lines
    end_attempt(tmp_path, {"returncode": 0, "seconds": 1.0, "resumed_from": 4}, keep=2)
    steps = read_steps(tmp_path / METRICS_FILE)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6, 7]
    assert steps[4]["data"]["critic/score/mean"] == 105.0  # step 5 from the attempt the run went on from
    assert (tmp_path / DONE).exists() and not (tmp_path / ATTEMPT_METRICS).exists()


def test_a_checkpoint_whose_step_was_never_logged_is_run_again(tmp_path):
    """Killed between saving step 3's checkpoint and logging step 3 (verl saves first): step 3's metrics exist
    nowhere, so the attempt resumes from checkpoint 2 and runs step 3 again; checkpoint 3 goes."""
    write_steps(tmp_path / ATTEMPT_METRICS, [1, 2])
    checkpoint(tmp_path, 1, 2, 3)
    (tmp_path / CHECKPOINTS / "global_step_1" / "actor").rmdir()  # verl's max_actor_ckpt_to_keep=2 pruned it
    resume, _ = begin_attempt(tmp_path)
    assert resume == 2 and (tmp_path / CHECKPOINTS / LATEST).read_text() == "2"
    # checkpoint 1's folder (verl pruned its weights) goes too: only the one resumed from is kept
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).glob("global_step_*")) == ["global_step_2"]
    assert [s["step"] for s in read_steps(tmp_path / METRICS_FILE)] == [1, 2]
    # nothing usable before: a fresh start, verl's pointer gone
    other = tmp_path / "other"
    other.mkdir()
    checkpoint(other, 1)
    (other / ATTEMPT_METRICS).write_text("")  # verl's file logger opens its file as the attempt starts
    assert begin_attempt(other)[0] == 0 and not (other / CHECKPOINTS / LATEST).exists()


def test_a_checkpoint_whose_step_was_logged_before_its_validation_is_kept_and_the_validation_owed(tmp_path):
    """Killed during step 2's validation, which egpo's trainer runs after logging the step: checkpoint 2 is kept, the
    attempt resumes there, and its command validates before training; a checkpoint of a run that egpo never logged
    (no metrics file at all) is verl's to resume from, untouched."""
    from egpo.ablation.attempt import NO_REVALIDATION, REVALIDATION, attempt_command
    from egpo.runs.state import VALIDATION_OWED, validation_owed

    write_steps(tmp_path / ATTEMPT_METRICS, [1, 2])
    checkpoint(tmp_path, 1, 2)
    (tmp_path / CHECKPOINTS / "global_step_2" / VALIDATION_OWED).write_text("2\n")
    resume, _ = begin_attempt(tmp_path)
    assert resume == 2 and (tmp_path / CHECKPOINTS / LATEST).read_text() == "2"
    assert validation_owed(tmp_path / CHECKPOINTS, 2) and not validation_owed(tmp_path / CHECKPOINTS, 1)
    assert attempt_command(["train"], 2, validation_owed=True) == ["train", REVALIDATION]
    assert attempt_command(["train"], 2) == ["train", NO_REVALIDATION] and attempt_command(["train"], 0) == ["train"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    checkpoint(foreign, 1, 2)
    assert begin_attempt(foreign)[0] == 2 and (foreign / CHECKPOINTS / LATEST).read_text() == "2"


def test_a_fresh_run_and_a_line_cut_by_a_kill(tmp_path):
    assert begin_attempt(tmp_path)[0] == 0 and read_steps(tmp_path / METRICS_FILE) == []
    (tmp_path / ATTEMPT_METRICS).write_text(json.dumps({"step": 1, "data": {}}) + '\n{"step": 2, "da')
    assert [s["step"] for s in logged_steps(tmp_path)] == [1]


def test_checkpoints_beyond_the_last_keep_are_removed_never_the_latest(tmp_path):
    checkpoint(tmp_path, 1, 2, 3, 4)
    removed = prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["global_step_1", "global_step_2"]
    assert sorted(p.name for p in (tmp_path / CHECKPOINTS).glob("global_step_*")) == ["global_step_3",
                                                                                      "global_step_4"]
    (tmp_path / CHECKPOINTS / LATEST).write_text("3")  # verl resumes from 3 (4 incomplete): 3 stays
    assert prune_checkpoints(tmp_path, keep=1) == []


def test_status_of_each_state(tmp_path):
    def run(name, **files):
        work = tmp_path / name
        work.mkdir()
        (work / RUN).write_text(json.dumps({"arm": name.split("__")[0], "seed": int(name[-1]), "steps": 10}))
        for key, text in files.items():
            (work / key).write_text(text)
        return work

    done = run("grpo__seed0")
    write_steps(done / METRICS_FILE, range(1, 11))
    (done / DONE).write_text(json.dumps({"returncode": 0, "seconds": 7200.0}))
    running = run("grpo__seed1")
    write_steps(running / METRICS_FILE, [1, 2])
    write_steps(running / ATTEMPT_METRICS, [3, 4])
    (running / ATTEMPT).write_text(json.dumps({"pid": os.getpid(), "resumed_from": 2, "started": 0.0}))
    dead = run("egpo_rollout__seed0")
    write_steps(dead / ATTEMPT_METRICS, [1])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (dead / ATTEMPT).write_text(json.dumps({"pid": gone.pid, "resumed_from": 0, "started": 0.0}))  # killed with it
    run("egpo_rollout__seed1")

    assert run_status(done).state == "done" and run_status(done).seconds == 7200.0
    assert (run_status(running).state, run_status(running).step) == ("running", 4)
    assert run_status(running).metric("critic/score/mean") == 4.0
    assert (run_status(dead).state, run_status(dead).step) == ("failed", 1)
    assert run_status(tmp_path / "egpo_rollout__seed1").state == "pending"

    from egpo.ablation import status_lines

    text = "\n".join(status_lines(tmp_path))
    assert "| grpo | done | running at step 4/10 |" in text
    assert "| egpo_rollout | FAILED at step 1/10 | pending |" in text
    assert "| grpo__seed0 | done | 10/10 | 2.0 h | 10 | - |" in text
    assert "1 done, 1 running, 1 failed, 1 pending of 4 run(s)" in text


def test_the_report_leaves_out_unfinished_runs_and_says_which(tmp_path):
    from egpo.report import load_runs, write_report

    for seed in (0, 1):
        work = tmp_path / f"grpo__seed{seed}"
        work.mkdir()
        (work / RUN).write_text(json.dumps({"arm": "grpo", "seed": seed, "steps": 3}))
        write_steps(work / METRICS_FILE, [1, 2, 3])
    (tmp_path / "grpo__seed0" / DONE).write_text("{}")
    write_steps(tmp_path / "grpo__seed1" / ATTEMPT_METRICS, [4])
    left_out = []
    assert list(load_runs(tmp_path, left_out)["grpo"]) == [0] and left_out == ["grpo__seed1"]
    assert "Left out, not finished" in write_report(tmp_path, window=1).read_text()


def test_ablation_refuses_keeping_fewer_than_two_checkpoints(tmp_path):
    from egpo.ablation import main
    from test_recipes import RECIPES

    with pytest.raises(SystemExit, match="--keep must be at least 2"):
        main([f"--config-path={RECIPES}", "--config-name=cpu_smoke", "--arms", "grpo", "--out", str(tmp_path),
              "--keep", "1"])


def test_status_of_a_run_whose_attempt_is_a_ray_job_or_on_another_machine(tmp_path):
    work = tmp_path / "egpo_rollout__seed0"
    work.mkdir()
    (work / RUN).write_text(json.dumps({"arm": "egpo_rollout", "seed": 0, "steps": 10}))
    assert run_status(work, job_alive=True).state == "submitted"  # the job waits for its node: no attempt yet
    write_steps(work / ATTEMPT_METRICS, [1, 2, 3])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a process id that is gone here
    (work / ATTEMPT).write_text(json.dumps({"pid": dead.pid, "host": "node-7", "resumed_from": 0, "started": 0.0}))
    assert (run_status(work).state, run_status(work).step) == ("running", 3)  # another machine's process: not ours
    assert run_status(work, job_alive=True).state == "running"
    assert run_status(work, job_alive=False).state == "failed"  # Ray says the job ended without done.json
    (work / ATTEMPT).write_text(json.dumps({"pid": dead.pid, "resumed_from": 0, "started": 0.0}))
    assert run_status(work).state == "failed"  # this machine's process, gone


def test_a_resumed_attempt_keeps_only_the_checkpoint_it_resumes_from(tmp_path):
    """verl's rotation (max_actor_ckpt_to_keep) knows only the checkpoints its own attempt saved: without a prune
    here, a resumed run would hold the dead attempt's 2 and the new attempt's 2. Before the attempt starts, every
    checkpoint but the resume point goes, so a run never holds more than keep + 1."""
    write_steps(tmp_path / ATTEMPT_METRICS, [1, 2, 3, 4, 5, 6])
    checkpoint(tmp_path, 4, 6)
    resume, _ = begin_attempt(tmp_path)
    assert resume == 6 and checkpoint_steps(tmp_path) == [6]
    checkpoint(tmp_path, 8, 10)  # the new attempt's own two (its rotation keeps 2)
    assert len(checkpoint_steps(tmp_path)) == 3  # keep + 1 at most


def test_a_resumed_attempts_validation_at_its_step_keeps_that_steps_training_metrics(tmp_path):
    """verl logs a resumed attempt's validation before training at the step it resumes from, in a line of its own;
    that step's training metrics, logged by the attempt that reached it, stay, and the validation is merged in."""
    (tmp_path / METRICS_FILE).write_text(
        json.dumps({"step": 19, "data": {"critic/score/mean": 0.4}}) + "\n" +
        json.dumps({"step": 20, "data": {"critic/score/mean": 0.5, "val-core/acc": 0.30}}) + "\n")
    (tmp_path / ATTEMPT_METRICS).write_text(
        json.dumps({"step": 20, "data": {"val-core/acc": 0.31}}) + "\n" +
        json.dumps({"step": 21, "data": {"critic/score/mean": 0.6}}) + "\n")
    steps = {s["step"]: s["data"] for s in logged_steps(tmp_path)}
    assert steps[20] == {"critic/score/mean": 0.5, "val-core/acc": 0.31}
    assert steps[21] == {"critic/score/mean": 0.6} and steps[19] == {"critic/score/mean": 0.4}


def test_a_resumed_attempt_does_not_validate_before_training():
    from hydra import compose, initialize_config_module

    from egpo.ablation.attempt import attempt_command

    command = ["python", "-m", "egpo.main", "trainer.val_before_train=true", "trainer.test_freq=20"]
    assert attempt_command(command, 0) == command  # a fresh run validates as configured
    resumed = attempt_command(command, 20)
    with initialize_config_module(config_module="egpo.config", version_base=None):
        cfg = compose("egpo_trainer", overrides=resumed[3:])
    assert cfg.trainer.val_before_train is False and cfg.trainer.test_freq == 20


def test_status_after_a_generate_ablation_lists_its_generations_beside_the_runs(tmp_path):
    """--generate writes generation folders with a run.json of their own (no arm, no seed) beside the runs and inside
    each: --status reads them as generations, not runs."""
    from egpo.ablation import status_lines

    work = tmp_path / "grpo__seed0"
    work.mkdir()
    (work / RUN).write_text(json.dumps({"arm": "grpo", "seed": 0, "steps": 3}))
    write_steps(work / METRICS_FILE, [1, 2, 3])
    (work / DONE).write_text(json.dumps({"returncode": 0, "seconds": 60.0}))
    folders = (("generate_base", True), ("generate_base_scored", False), ("grpo__seed0/generate_on_base", True))
    for folder, done in folders:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / RUN).write_text(json.dumps({"fingerprint": {"model": "x"}}))
        if done:
            (tmp_path / folder / DONE).write_text("{}")
    text = "\n".join(status_lines(tmp_path))
    assert "| grpo | done |" in text and "1 done of 1 run(s)" in text
    assert text.splitlines()[-1] == ("generations: generate_base done, generate_base_scored not done, "
                                     "grpo__seed0/generate_on_base done")
