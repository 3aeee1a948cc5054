"""Config composition of the user's exact command line, and every start-up error."""

import os
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from egpo.errors import EgpoError
from egpo.settings import EgpoConfigError, EgpoSettings
from test_recipes import RECIPES
from egpo.preflight.think_tokens import lookup_think_token_ids, resolve_think_token_ids
from egpo.preflight.temperature import temperature_finding
from egpo.preflight.run_facts import with_facts


def composed(*overrides):
    with initialize_config_module(config_module="egpo.config", version_base=None):
        return compose(config_name="egpo_trainer", overrides=list(overrides))


def run_main(*args, env=None):
    return subprocess.run([sys.executable, "-m", "egpo.main", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_users_line_composes_without_plus_and_verls_example_recipe_runs_as_egpos_with_one_note():
    """The user's line, with the recipe options of verl's example scripts (``python3 -m verl.trainer.main_ppo``
    replaced by ``python -m egpo.main`` and nothing else changed: ``--config-path=./config
    --config-name=ppo_trainer``); with ``--cfg job`` stdout is the YAML alone (``> job.yaml``), the note on stderr."""
    proc = run_main("--config-path=./config", "--config-name=ppo_trainer", "--cfg", "job",
                    "algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout")
    assert proc.returncode == 0, proc.stderr
    assert ("[egpo] --config-name=ppo_trainer is verl's trainer config: egpo runs its own egpo_trainer "
            "(verl's ppo_trainer with egpo's keys, in place of --config-path=./config)") in proc.stderr.splitlines()
    assert "[egpo]" not in proc.stdout and proc.stdout.startswith("model_engine:"), proc.stdout[:300]
    cfg = yaml.safe_load(proc.stdout)
    algo = cfg["algorithm"]
    assert algo["adv_estimator"] == "egpo" and algo["entropy_source"] == "rollout"
    assert algo["egpo_lambda"] == 0.4 and algo["egpo_alpha"] == 2.0
    assert algo["cot_start_token_id"] is None and algo["cot_end_token_id"] is None
    # the rest is verl's ppo_trainer
    assert "actor_rollout_ref" in cfg and "rollout_correction" in algo


def refused_by_the_main_jobs_pass(*overrides) -> str:
    """The refusal egpo.main prints for this command line, from its pass before Ray (prepare_config); that the main
    job prints it as one line before anything starts: tests/test_startup_checks.py's runs of it."""
    from egpo.preflight.prepare import prepare_config

    with pytest.raises(EgpoError) as refused:
        prepare_config(composed(*overrides), preflight=None)
    return str(refused.value)


def test_typo_in_entropy_source_is_refused_with_the_allowed_values():
    message = refused_by_the_main_jobs_pass("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollot")
    assert "algorithm.entropy_source='rollot' is not one of 'actor', 'rollout'" in message


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm.egpo_alpha=0"], "egpo_alpha must be > 0"),
        (["algorithm.egpo_alpha=-1"], "egpo_alpha must be > 0"),
        (["algorithm.egpo_lambda=2.0"], r"egpo_lambda must lie in \[0, egpo_alpha\)"),
        (["algorithm.egpo_lambda=-0.1"], r"egpo_lambda must lie in \[0, egpo_alpha\)"),
        (["algorithm.cot_start_token_id=5", "algorithm.cot_end_token_id=5"], "must differ"),
        (["algorithm.cot_start_token_id=abc"], "must be a token id"),
        (["algorithm.rollout_correction.bypass_mode=true"], "bypass_mode=true skips"),
    ],
)
def test_startup_errors(overrides, message):
    cfg = composed("algorithm.adv_estimator=egpo", *overrides)
    with pytest.raises(EgpoConfigError, match=message):
        EgpoSettings.from_algorithm(cfg.algorithm)


def test_bypass_mode_with_rollout_entropy_is_allowed():
    cfg = composed("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout",
                   "algorithm.rollout_correction.bypass_mode=true")
    s = EgpoSettings.from_algorithm(cfg.algorithm)
    assert s.enabled and s.bypass_mode and s.entropy_key == "rollout_entropy"


def test_a_nodes_settings_are_read_once_and_forgotten_with_the_node():
    import gc

    from egpo.settings import _READ

    cfg = composed("algorithm.adv_estimator=egpo", "algorithm.entropy_source=rollout")
    first = EgpoSettings.of(cfg.algorithm)
    assert EgpoSettings.of(cfg.algorithm) is first and first.entropy_key == "rollout_entropy"
    other = composed("algorithm.adv_estimator=egpo", "algorithm.entropy_source=actor")
    assert EgpoSettings.of(other.algorithm).algo.entropy_source == "actor"  # another node, its own reading
    held = {id(cfg.algorithm), id(other.algorithm)}
    assert held <= set(_READ)
    del cfg, other
    gc.collect()
    assert not held & set(_READ)


def test_other_estimators_are_not_egpo():
    assert not EgpoSettings.from_algorithm(composed("algorithm.adv_estimator=grpo").algorithm).enabled


class VocabTokenizer:
    name_or_path = "stub"

    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)


def test_think_ids_looked_up_from_the_tokenizer():
    cfg = composed("algorithm.adv_estimator=egpo")
    resolve_think_token_ids(cfg, VocabTokenizer({"a": 0, "<think>": 11, "</think>": 12}))
    assert (cfg.algorithm.cot_start_token_id, cfg.algorithm.cot_end_token_id) == (11, 12)
    explicit = composed("algorithm.adv_estimator=egpo", "algorithm.cot_start_token_id=3",
                        "algorithm.cot_end_token_id=4")
    resolve_think_token_ids(explicit, VocabTokenizer({}))  # explicit ids need no lookup
    assert (explicit.algorithm.cot_start_token_id, explicit.algorithm.cot_end_token_id) == (3, 4)


def test_tokenizer_without_think_tokens_is_refused():
    with pytest.raises(EgpoConfigError, match="has no '</think>' token.*algorithm.egpo_span=response"):
        lookup_think_token_ids(VocabTokenizer({"<think>": 1}))


def test_response_span_runs_without_think_tokens_and_fills_them_where_present():
    cfg = composed("algorithm.adv_estimator=egpo", "algorithm.egpo_span=response")
    resolve_think_token_ids(cfg, VocabTokenizer({"a": 0}))  # not refused: nothing needs the markers
    assert (cfg.algorithm.cot_start_token_id, cfg.algorithm.cot_end_token_id) == (None, None)
    assert EgpoSettings.from_algorithm(cfg.algorithm).algo.egpo_span == "response"
    thinking = composed("algorithm.adv_estimator=egpo", "algorithm.egpo_span=response")
    resolve_think_token_ids(thinking, VocabTokenizer({"<think>": 11, "</think>": 12}))  # CoT figures still logged
    assert (thinking.algorithm.cot_start_token_id, thinking.algorithm.cot_end_token_id) == (11, 12)
    cot = composed("algorithm.adv_estimator=egpo", "algorithm.egpo_span=cot")
    with pytest.raises(EgpoConfigError, match="egpo_span=response"):
        resolve_think_token_ids(cot, VocabTokenizer({"a": 0}))


@pytest.mark.parametrize("key, value, allowed", [("egpo_granularity", "per_token", "'response', 'token'"),
                                                 ("egpo_span", "thinking", "'cot', 'response'")])
def test_unknown_variant_value_is_refused_with_the_allowed_ones(key, value, allowed):
    cfg = composed("algorithm.adv_estimator=egpo", f"algorithm.{key}={value}")
    with pytest.raises(EgpoConfigError, match=f"algorithm.{key}='{value}' is not one of {allowed}"):
        EgpoSettings.from_algorithm(cfg.algorithm)


@pytest.mark.parametrize("granularity", ["response", "token"])
@pytest.mark.parametrize("span", ["cot", "response"])
def test_variant_settings_and_words(granularity, span):
    cfg = composed("algorithm.adv_estimator=egpo", f"algorithm.egpo_granularity={granularity}",
                   f"algorithm.egpo_span={span}")
    settings = EgpoSettings.from_algorithm(cfg.algorithm)
    assert (settings.algo.egpo_granularity, settings.algo.egpo_span) == (granularity, span)
    assert f"egpo_granularity={granularity} egpo_span={span}" in settings.variant


def test_tokenizer_without_think_tokens_stops_the_job_before_ray(tmp_path):
    from egpo.demo.tokenizer import build_tokenizer

    path = tmp_path / "tok"
    build_tokenizer(with_think_tokens=False).save_pretrained(path)
    message = refused_by_the_main_jobs_pass("algorithm.adv_estimator=egpo", f"actor_rollout_ref.model.path={path}")
    assert "has no '<think>' token" in message


def test_unknown_variant_stops_the_job_before_ray():
    message = refused_by_the_main_jobs_pass("algorithm.adv_estimator=egpo", "algorithm.egpo_granularity=sequence")
    assert "algorithm.egpo_granularity='sequence' is not one of 'response', 'token'" in message


def test_temperature_mismatch_is_reported_when_entropies_are_compared():
    """A warning of the pass (egpo.preflight lists it; a run prints it before Ray starts)."""
    from egpo.preflight.prepare import prepare

    cfg = composed("algorithm.adv_estimator=egpo", "actor_rollout_ref.rollout.temperature=0.7")
    found = temperature_finding(*with_facts(cfg, settings=EgpoSettings.from_algorithm(cfg.algorithm)))
    assert found.level == "warning" and "temperature is 0.7" in found.text
    in_the_pass = prepare(composed("algorithm.adv_estimator=egpo", "actor_rollout_ref.rollout.temperature=0.7"),
                          preflight="all", echo=lambda _: None).findings
    assert any(f.topic == "temperature" and "temperature is 0.7" in f.text for f in in_the_pass)
    at_one = composed("algorithm.adv_estimator=egpo", "actor_rollout_ref.rollout.temperature=1.0")
    assert temperature_finding(*with_facts(at_one, settings=EgpoSettings.from_algorithm(at_one.algorithm))) is None
    OmegaConf.set_struct(cfg, False)
    cfg.actor_rollout_ref.rollout.custom = {"entropy": {"temperature_scaled": True}}
    assert temperature_finding(*with_facts(cfg, settings=EgpoSettings.from_algorithm(cfg.algorithm))) is None


@pytest.mark.parametrize("args, equivalent", [
    (["--config-name=ppo_megatron_trainer"], "egpo_megatron_trainer"),
    (["--config-name", "ppo_trainer"], "egpo_trainer"),
    (["--config-name=ppo_trainer.yaml"], "egpo_trainer"),
    (["--config-path=./config", "--config-name=ppo_trainer"], "egpo_trainer"),  # as verl's example scripts pass it
    ([f"--config-path={RECIPES}", "--config-name=ppo_trainer"], "egpo_trainer"),
])
def test_verls_config_name_is_egpos_config_of_that_name(args, equivalent):
    from egpo.recipe_names import config_args, egpo_equivalent

    path, name, note = egpo_equivalent(*config_args(args))
    assert (path, name) == (None, equivalent) and note.startswith("[egpo] --config-name=") and "\n" not in note
    assert egpo_equivalent(None, equivalent) == (None, equivalent, None)


def test_a_users_own_copy_of_verls_config_name_is_read(tmp_path):
    (tmp_path / "ppo_trainer.yaml").write_text("own_copy: true\n")
    proc = run_main(f"--config-path={tmp_path}", "--config-name=ppo_trainer", "--cfg", "job")
    assert proc.returncode == 0 and yaml.safe_load(proc.stdout) == {"own_copy": True}, proc.stderr


def test_an_environment_that_cannot_run_verls_trainer_is_refused_before_verl_is_imported(monkeypatch):
    """The main job reads the environment from package metadata first: a missing undeclared import or a transformers
    the installed verl cannot run is one refusal line, and nothing of verl's trainer was imported for it."""
    import sys

    from egpo import main as egpo_main
    from egpo.compat import versions

    problem = "verl X's trainer imports uvicorn ...: pip install uvicorn"
    monkeypatch.setattr(versions, "environment_problems", lambda: [problem])
    monkeypatch.setattr(sys, "argv", ["egpo.main", "--config-name=ppo_trainer"])
    monkeypatch.setattr(egpo_main, "hydra_main", lambda: pytest.fail("Hydra must not compose"))
    with pytest.raises(SystemExit) as refused:
        egpo_main.main()
    assert str(refused.value) == ("[egpo] refused before anything started: verl X's trainer imports uvicorn ...: pip "
                                  "install uvicorn. Nothing was started.")
    from pathlib import Path

    main_source = Path(egpo_main.__file__).read_text()
    top_level = main_source[:main_source.index("\ndef ")]
    assert "verl" not in {line.split()[1].split(".")[0] for line in top_level.splitlines()
                          if line.startswith(("import ", "from "))}


def test_a_scripts_own_search_path_keeps_egpos_and_verls_beside_it(tmp_path):
    """verl's Megatron-Lite examples pass ``hydra.searchpath=[pkg://verl_mlite.config]``, which replaces a config's
    own search path: egpo keeps its and verl's config packages after the script's entries, through either door (the
    main job and the composing entry points), and says so on stderr."""
    own = tmp_path / "own_configs"
    (own / "egpo_extra").mkdir(parents=True)
    (own / "egpo_extra" / "mine.yaml").write_text("extra_key: 7\n")
    searchpath = f"hydra.searchpath=[file://{own}]"
    for args in (["--config-path=./config", "--config-name=ppo_trainer"], [f"--config-path={RECIPES}",
                                                                            "--config-name=cpu_smoke"]):
        proc = run_main(*args, searchpath, "+egpo_extra=mine", "--cfg", "job")
        assert proc.returncode == 0, proc.stderr[-2000:]
        cfg = yaml.safe_load(proc.stdout)
        assert cfg["egpo_extra"] == {"extra_key": 7} and "entropy_source" in cfg["algorithm"]  # the script's and egpo's
        assert ("[egpo] hydra.searchpath: pkg://egpo.config, pkg://verl.trainer.config kept after the command line's "
                "own entries (egpo's configs compose from them)") in proc.stderr.splitlines()
    from egpo.preflight.compose import compose as egpo_compose

    notes = []
    cfg = egpo_compose(str(RECIPES), "cpu_smoke", [searchpath, "+egpo_extra=mine"], echo=notes.append)
    assert cfg.egpo_extra.extra_key == 7 and len(notes) == 1


@pytest.mark.parametrize("given, kept", [
    ("hydra.searchpath=[pkg://verl_mlite.config]", "hydra.searchpath=[pkg://verl_mlite.config,pkg://egpo.config,"
                                                   "pkg://verl.trainer.config]"),
    ("++hydra.searchpath=['pkg://a', \"file:///b\"]", "++hydra.searchpath=[pkg://a,file:///b,pkg://egpo.config,"
                                                      "pkg://verl.trainer.config]"),
    ("hydra.searchpath=[pkg://verl.trainer.config,pkg://egpo.config]", None),  # both there: untouched, no note
    ("hydra.searchpath=[]", "hydra.searchpath=[pkg://egpo.config,pkg://verl.trainer.config]"),
    ("hydra.searchpath=${oc.env:PATHS}", None),  # not a list Hydra's grammar alone gives: Hydra's to read
    ("trainer.searchpath=[x]", None),
])
def test_search_path_rewrite(given, kept):
    from egpo.recipe_names import with_egpo_searchpath

    argv, note = with_egpo_searchpath(["algorithm.adv_estimator=egpo", given])
    assert argv == ["algorithm.adv_estimator=egpo", kept or given]
    assert (note is None) == (kept is None or kept == given)


def test_a_verl_key_misspelled_with_plus_is_refused_with_the_key_meant():
    """Hydra answers ``trainer.total_training_step=5`` by advising ``+``; with it the run would train verl's default
    step count. Both doors refuse it before Ray, naming the key meant; a new key far from every key of its node (a
    reward function's own kwargs) stays allowed."""
    proc = run_main(f"--config-path={RECIPES}", "--config-name=cpu_smoke", "+trainer.total_training_step=5")
    assert proc.returncode != 0 and "Ray" not in proc.stdout
    (line,) = [l for l in (proc.stdout + proc.stderr).splitlines() if l.startswith("[egpo] refused")]
    assert ("+trainer.total_training_step adds a key nothing reads, within a typo of trainer.total_training_steps: "
            "the run would keep trainer.total_training_steps=") in line and line.endswith("(without +)?")
    from egpo.preflight.compose import compose as egpo_compose

    with pytest.raises(EgpoError, match=r"typo of trainer\.total_training_steps"):
        egpo_compose(str(RECIPES), "cpu_smoke", ["+trainer.total_training_step=5"], echo=lambda _: None)
    allowed = egpo_compose(str(RECIPES), "cpu_smoke", ["+custom_reward_function.reward_kwargs.length_penalty=0.1",
                                                      "+trainer.my_own_note=x"], echo=lambda _: None)
    assert allowed.custom_reward_function.reward_kwargs.length_penalty == 0.1


def test_appended_typo_check_against_hand_written_nodes():
    from egpo.preflight.key_check import appended_typo_problems

    config = OmegaConf.create({"trainer": {"total_training_steps": 3, "save_freq": 1, "total_training_step": 5},
                               "reward": {"kwargs": {}}})
    assert len(appended_typo_problems(config, ["+trainer.total_training_step=5"])) == 1
    assert appended_typo_problems(config, ["++trainer.total_training_step=5"]) == []  # ++ sets a key it may hold
    assert appended_typo_problems(config, ["trainer.save_freq=2", "+reward.kwargs.save_freqs=1"]) == []
