"""A folder given to the wrong command: each command says what the folder is and what to run on it instead, a
misspelled one is "no such folder" (with the sibling meant), and nothing suggests writing into a typo or into a
training run's folder."""

import json

import pytest

from egpo.folders import ABLATION, GENERATION, MISSING, OTHER, TRAINING, folder_kind, no_such_folder
from generation_rows import random_rows, write_run


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory as a researcher's: a main job's run, an ablation with one run, a finished generation."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "checkpoints" / "egpo" / "cpu_warm"
    (run / "global_step_30" / "actor").mkdir(parents=True)
    (run / "latest_checkpointed_iteration.txt").write_text("30")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "data": {"critic/score/mean": 0.5}}) + "\n")
    (run / "config.yaml").write_text("trainer: {}\n")
    arm = tmp_path / "abl" / "grpo__seed0"
    arm.mkdir(parents=True)
    (arm / "run.json").write_text(json.dumps({"arm": "grpo", "seed": 0}))
    (arm / "metrics.jsonl").write_text(json.dumps({"step": 1, "data": {"critic/score/mean": 0.5}}) + "\n")
    write_run(tmp_path / "gen" / "base", random_rows(0, n_rows=4))
    return tmp_path


def test_each_kind_of_folder_is_told_from_its_files(workdir):
    assert folder_kind(workdir / "checkpoints" / "egpo" / "cpu_warm") == TRAINING
    assert folder_kind(workdir / "abl" / "grpo__seed0") == TRAINING  # one run of an ablation
    assert folder_kind(workdir / "abl") == ABLATION
    assert folder_kind(workdir / "gen" / "base") == GENERATION
    assert folder_kind(workdir / "gen") == OTHER
    assert folder_kind(workdir / "gen" / "bsae") == MISSING
    assert no_such_folder("--score", "gen/bsae") == "--score gen/bsae: no such folder (did you mean gen/base?)"
    assert no_such_folder("", "gen/unrelated") == "gen/unrelated: no such folder"


def analyze_refusal(capsys, *args):
    from egpo.analyze.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main([*args, "--out", "analysis"])
    return str(stop.value.code)


def test_analyze_says_no_such_folder_and_what_a_training_or_ablation_folder_takes(workdir, capsys):
    said = analyze_refusal(capsys, "gen/base", "gen/trained_on_bsae")
    assert said == "[egpo] analyze: gen/trained_on_bsae: no such folder"
    said = analyze_refusal(capsys, "gen/bsae")
    assert said == "[egpo] analyze: gen/bsae: no such folder (did you mean gen/base?)"
    said = analyze_refusal(capsys, "checkpoints/egpo/cpu_warm")
    assert "is a training run's folder, not an egpo.generate run: its report is python -m egpo.report " \
           "checkpoints/egpo/cpu_warm" in said
    assert "--checkpoint checkpoints/egpo/cpu_warm --out checkpoints/egpo/cpu_warm/generate" in said
    assert "--out checkpoints/egpo/cpu_warm " not in said + " "  # never the training run's own folder
    said = analyze_refusal(capsys, "abl")
    assert "abl is an ablation's folder: its report is python -m egpo.report abl" in said
    assert not (workdir / "analysis").exists()


def generate_refusal(*args):
    from egpo.generate.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["--config-path=recipes", "--config-name=cpu_warm", *args])
    return str(stop.value.code)


def test_generate_never_writes_into_a_training_runs_folder_and_scores_only_a_generation(workdir):
    said = generate_refusal("--out", "checkpoints/egpo/cpu_warm")
    assert said == ("[egpo] generate refused before anything started: --out checkpoints/egpo/cpu_warm is a training "
                    "run's folder (its checkpoints and metrics): give the generation a folder of its own, e.g. "
                    "--out checkpoints/egpo/cpu_warm/generate")
    assert "is an ablation's folder" in generate_refusal("--out", "abl")
    said = generate_refusal("--score", "gen/bsae", "--out", "gen/scored")
    assert said.endswith("--score gen/bsae: no such folder (did you mean gen/base?)")
    said = generate_refusal("--score", "checkpoints/egpo/cpu_warm", "--out", "gen/scored")
    assert "--score checkpoints/egpo/cpu_warm is a training run's folder, not a generation run: sample from its " \
           "checkpoint with python -m egpo.generate --config-path=recipes --config-name=cpu_warm --checkpoint " \
           "checkpoints/egpo/cpu_warm --out checkpoints/egpo/cpu_warm/generate" in said
    assert sorted(p.name for p in (workdir / "checkpoints" / "egpo" / "cpu_warm").iterdir()) == [
        "config.yaml", "global_step_30", "latest_checkpointed_iteration.txt", "metrics.jsonl"]
    assert not (workdir / "gen" / "scored").exists() and not (workdir / "gen" / "bsae").exists()


def report_refusal(where):
    from egpo.report import main

    with pytest.raises(SystemExit) as stop:
        main([str(where)])
    return str(stop.value.code)


def test_report_on_a_wrong_folder_is_refused_like_every_other_command_with_the_fix(workdir):
    assert report_refusal("checkpoints/egpo/cpu_wram") == \
        "[egpo] report: checkpoints/egpo/cpu_wram: no such folder (did you mean checkpoints/egpo/cpu_warm?)"
    assert report_refusal("gen/base") == ("[egpo] report: gen/base is an egpo.generate run (samples, no training "
                                          "metrics): its tokens are read by python -m egpo.analyze gen/base --out "
                                          "gen/base/analysis")
    assert report_refusal("abl") == ("[egpo] report: no run under abl has finished (grpo__seed0): python -m "
                                     "egpo.ablation --status abl shows where each is")
    said = report_refusal("gen")
    assert said.startswith("[egpo] report: no finished run's metrics under gen (metrics.jsonl") and \
        "trainer.default_local_dir" in said
