"""How every entry point reads a recipe name (egpo.recipe_names): one it does not find is refused in one line, before
anything composes, naming the recipes the folder holds and the one most likely meant; verl's trainer config names run
as egpo's, with one note."""

from __future__ import annotations

import sys

import pytest

from egpo.recipe_names import recipe_name_problems
from test_recipes import RECIPES


def test_a_recipe_that_exists_anywhere_hydra_looks_is_no_problem():
    assert recipe_name_problems(str(RECIPES), "cpu_smoke") == []
    assert recipe_name_problems(str(RECIPES), "cpu_smoke.yaml") == []
    assert recipe_name_problems(None, "egpo_trainer") == []  # egpo's own configs
    assert recipe_name_problems(str(RECIPES), "ppo_trainer") == []  # verl's, on egpo's search path
    assert recipe_name_problems(None, None) == []


def test_a_misspelled_recipe_names_the_one_meant_and_the_folders_recipes():
    (problem,) = recipe_name_problems(str(RECIPES), "qwen3_4")
    assert "did you mean --config-name=qwen3_4b?" in problem
    assert "the recipes there: " + ", ".join(sorted(p.stem for p in RECIPES.glob("*.yaml"))) in problem
    (problem,) = recipe_name_problems(str(RECIPES), "something_else_entirely")
    assert "did you mean" not in problem and "no such recipe" in problem


def test_a_folder_that_does_not_exist_is_named_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (problem,) = recipe_name_problems("recipes", "cpu_smoke")
    assert problem.startswith("--config-path=recipes: no such folder") and '--config-path="$PWD/recipes"' in problem


def refusal(main, argv) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    return str(stopped.value.code)


@pytest.mark.parametrize("tool", ["main", "preflight", "generate", "ablation"])
def test_every_entry_point_refuses_it_in_one_line(tool, tmp_path, monkeypatch):
    argv = [f"--config-path={RECIPES}", "--config-name=cpu_smok"]
    if tool == "main":
        from egpo.main import main

        monkeypatch.setattr(sys, "argv", ["egpo.main", *argv])
        message = refusal(lambda _: main(), None)
    elif tool == "preflight":
        from egpo.preflight.__main__ import main

        message = refusal(main, argv)
    elif tool == "generate":
        from egpo.generate.__main__ import main

        message = refusal(main, [*argv, "--out", str(tmp_path / "gen")])
    else:
        from egpo.ablation.cli import main

        message = refusal(main, [*argv, "--arms", "grpo", "--out", str(tmp_path / "ablation")])
    assert "\n" not in message and "did you mean --config-name=cpu_smoke?" in message, message
    assert not (tmp_path / "gen").exists()  # refused before anything was written


def test_the_entry_points_that_compose_read_verls_config_name_as_egpo_main_does(capsys):
    """egpo.preflight, egpo.generate and egpo.ablation compose through egpo.preflight.compose."""
    from egpo.preflight.compose import compose

    config = compose("./config", "ppo_trainer", ["algorithm.adv_estimator=egpo"])
    assert "egpo_lambda" in config.algorithm
    assert capsys.readouterr().out.startswith("[egpo] --config-name=ppo_trainer is verl's trainer config: egpo runs "
                                              "its own egpo_trainer")


def test_the_composing_entry_points_refuse_a_misspelled_key_before_hydra():
    from egpo.errors import EgpoConfigError
    from egpo.preflight.compose import compose

    with pytest.raises(EgpoConfigError, match="did you mean algorithm.egpo_lambda"):
        compose(str(RECIPES), "cpu_smoke", ["algorithm.egpo_lamda=0.3"])


def test_generate_refuses_a_missing_data_file_before_ray_in_one_line_and_keeps_its_out_free(tmp_path, demo):
    """The main job's data check runs before egpo.generate starts Ray; nothing is written to --out, so the corrected
    command can use it."""
    from egpo.generate.__main__ import main

    out = tmp_path / "gen"
    message = refusal(main, [f"--config-path={RECIPES}", "--config-name=cpu_smoke", "--out", str(out),
                             f"egpo_demo.out={demo}", f"data.val_files={tmp_path / 'missing.parquet'}"])
    assert message.startswith("[egpo] generate refused before anything started: data.val_files: ") and \
        "missing.parquet not found" in message and "\n" not in message, message
    assert not (out / "run.json").exists()


@pytest.mark.parametrize("argv", [
    ["algorithm.egpo_lambda=0.2", "trainer.seed=1", "--config-path=/r", "--config-name=cpu_warm"],  # after a rewrite
    ["--config-path", "/r", "--config-name", "cpu_warm"],
    ["--config-name=cpu_warm", "a=1", "~ray_kwargs.ray_init.num_gpus", "+b=2"],
    ["--multirun", "--config-name=cpu_warm", "a=1,2"],
])
def test_hydras_folder_goes_into_the_run_directory_wherever_the_command_line_puts_its_overrides(argv):
    """egpo.main adds Hydra's run folder (in the run directory, not outputs/ in the working directory) to the one run
    of overrides Hydra's parser reads, so the command line parses as it did; a command line that names its own, or
    runs nothing (--cfg, --help), is left as it is."""
    from hydra._internal.utils import get_args_parser

    from egpo.main import HYDRA_RUN_DIR, with_hydras_folder_in_the_run

    given = get_args_parser().parse_args(argv)
    added = get_args_parser().parse_args(with_hydras_folder_in_the_run(argv))
    assert added.overrides == [*given.overrides, HYDRA_RUN_DIR]
    assert (added.config_path, added.config_name, added.multirun) == (given.config_path, given.config_name,
                                                                      given.multirun)
    for unchanged in ([*argv, "hydra.run.dir=elsewhere"], [*argv, "--cfg", "job"], [*argv, "--help"]):
        assert with_hydras_folder_in_the_run(unchanged) == unchanged
