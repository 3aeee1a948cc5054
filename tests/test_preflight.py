"""The preflight: every recipe in recipes/, each check failing on the config it is for, and the same checks at
start-up (before Ray). Figures are compared with the arithmetic done by hand from the composed config."""

import json
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from egpo.data import write
from egpo.preflight.__main__ import run
from egpo.preflight.loggers import logger_findings, wandb_credentials
from egpo.settings import EgpoConfigError
from conftest import VERL
from test_recipes import RECIPES
from egpo.preflight.run_facts import with_facts

SAMPLES = Path(__file__).resolve().parent / "data"
QWEN3 = sorted(p.stem for p in RECIPES.glob("qwen3_*.yaml"))
CPU = sorted(p.stem for p in RECIPES.glob("cpu_*.yaml"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory holding data/math_{train,test,val}.parquet as python -m egpo.data writes them (MATH's fields;
    1,000 training and 2,000 test rows from the shipped samples)."""
    root = tmp_path_factory.mktemp("preflight")
    rows = [json.loads(line) for line in (SAMPLES / "math_sample.jsonl").read_text().splitlines()]
    for split, count in (("train", 1000), ("test", 2000)):
        path = root / f"{split}.jsonl"
        path.write_text("".join(json.dumps(rows[i % len(rows)]) + "\n" for i in range(count)))
        write("math", root / "data", path, split)
    return root


def overrides_for(recipe: str, demo: Path) -> list[str]:
    if recipe in CPU:
        return [f"egpo_demo.out={demo}"]
    # a tokenizer with <think>, as Qwen3's has
    return [f"actor_rollout_ref.model.path={demo / 'model'}"]


def composed(recipe: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name=recipe, overrides=overrides)


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("*.yaml")))
def test_every_recipe_passes_with_its_figures(recipe, demo, workdir, monkeypatch):
    monkeypatch.chdir(workdir)  # the Qwen3 recipes read data/*.parquet relative to where the command runs
    overrides = overrides_for(recipe, demo)
    status, lines = run(str(RECIPES), recipe, overrides)
    text = findings_text(lines)
    assert status == 0, text
    cfg = composed(recipe, overrides)
    batch, n = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    assert f"{batch} prompts x {n} samples = {batch * n:,} generations, at most {batch * n * length:,} tokens" in text
    steps = cfg.trainer.total_training_steps
    assert f"{steps} steps: {steps * batch * n:,} training generations" in text
    if recipe in QWEN3:
        # before training + every 20th of 200 steps; 500 validation prompts x 4 thinking-mode samples
        assert str(workdir / "data" / "math_val.parquet") in text and "500 rows" in text
        validations = 1 + steps // cfg.trainer.test_freq
        val = validations * 500 * cfg.actor_rollout_ref.rollout.val_kwargs.n
        assert f"{validations} validations x 500 prompts x 4 samples = {val:,} generations = " \
               f"{val / (steps * batch * n):.0%} of training" in text
        assert "error" not in text.replace("0 error(s)", "") and "warning(s)" in text


def qwen3(workdir, demo, monkeypatch, *extra):
    monkeypatch.chdir(workdir)
    return run(str(RECIPES), "qwen3_1.7b", [*overrides_for("qwen3_1.7b", demo), *extra])


def findings_text(lines):
    """The findings and the summary, without the header line (which repeats the overrides)."""
    return "\n".join(lines[1:])


def test_missing_data_is_an_error_naming_the_command(demo, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status, lines = run(str(RECIPES), "qwen3_1.7b", overrides_for("qwen3_1.7b", demo))
    text = findings_text(lines)
    assert status == 1
    assert f"data.train_files: {tmp_path / 'data' / 'math_train.parquet'} not found; python -m egpo.data math" in text


def test_validation_share_warns_and_the_suggested_fix_works_pasted(demo, workdir, monkeypatch):
    status, lines = qwen3(workdir, demo, monkeypatch, "data.val_files=data/math_test.parquet")
    text = findings_text(lines)
    assert status == 0  # a warning: hours wasted, not a broken run
    assert "11 validations x 2,000 prompts x 4 samples = 88,000 generations = 43% of training" in text
    fix = re.search(r"(\+\+data\.val_max_samples=\d+)", text).group(1)
    _, lines = qwen3(workdir, demo, monkeypatch, "data.val_files=data/math_test.parquet", fix)
    assert "use a validation subset" not in findings_text(lines)


@pytest.mark.parametrize("override, expected", [
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096", "ppo_max_token_len_per_gpu=4096 is smaller than one "
                                                               "sequence"),
    ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=8000", "log_prob_max_token_len_per_gpu=8000 is smaller"),
    ("data.train_batch_size=2048", "fewer than data.train_batch_size=2048: verl drops the partial batch"),
    ("actor_rollout_ref.rollout.tensor_model_parallel_size=3", "tensor_model_parallel_size=3 does not divide the 8"),
    ("actor_rollout_ref.rollout.temperature=0", "verl's validate_config refuses this config"),
    ("data.max_prompt_length=120", "are dropped by data.filter_overlong_prompts"),
    ("++actor_rollout_ref.rollout.engine_kwargs.sglang.enable_dp_attention=true", "engine_kwargs.sglang.enable_dp_attention=True"),
    ("trainer.logger=[console,file,swanlab]", "swanlab, which is not installed"),
])
def test_each_check_reports_its_problem(demo, workdir, monkeypatch, override, expected):
    status, lines = qwen3(workdir, demo, monkeypatch, override)
    text = findings_text(lines)
    assert expected in text, text
    is_error = not override.startswith("data.max_prompt_length")
    assert status == (1 if is_error else 0), text


def test_token_budget_fix_works_pasted(demo, workdir, monkeypatch):
    _, lines = qwen3(workdir, demo, monkeypatch, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096")
    fix = re.search(r"set (actor_rollout_ref\.actor\.ppo_max_token_len_per_gpu=\d+)", findings_text(lines)).group(1)
    status, lines = qwen3(workdir, demo, monkeypatch, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096", fix)
    assert status == 0, findings_text(lines)


def test_greedy_validation_and_short_epochs_are_warned(demo, workdir, monkeypatch):
    _, lines = qwen3(workdir, demo, monkeypatch, "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
                     "trainer.total_epochs=2")
    text = findings_text(lines)
    assert "val_kwargs.do_sample=false validates greedily" in text
    # 1,000 rows / 128 = 7 steps an epoch: 2 epochs end the run after 14 steps, not 200
    assert "ends the run after 14 steps" in text and "set trainer.total_epochs=29" in text


def test_wandb_without_credentials_is_refused(monkeypatch, tmp_path):
    import importlib.util

    from omegaconf import OmegaConf

    for key in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert not wandb_credentials()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "wandb" else real(name, *a))
    cfg = OmegaConf.create({"trainer": {"logger": ["console", "wandb"]}})
    errors = [f.text for f in logger_findings(cfg) if f.level == "error"]
    assert len(errors) == 1 and "no wandb credentials" in errors[0] and "trainer.logger=[console]" in errors[0]
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    assert wandb_credentials() and not [f for f in logger_findings(cfg) if f.level == "error"]
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_credentials()


def test_start_up_runs_the_cheap_checks_before_ray(demo, workdir, monkeypatch, tmp_path):
    """egpo.main's prepare_config: relative data paths made absolute where the command runs, and a missing file
    refused (EgpoConfigError, before Ray)."""
    from egpo.preflight.prepare import prepare_config

    monkeypatch.chdir(workdir)
    cfg = prepare_config(composed("qwen3_1.7b", overrides_for("qwen3_1.7b", demo)))
    assert cfg.data.train_files == str(workdir / "data" / "math_train.parquet")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(EgpoConfigError, match="math_train.parquet not found; python -m egpo.data math"):
        prepare_config(composed("qwen3_1.7b", overrides_for("qwen3_1.7b", demo)))


# verl 0.7.1's engine workers, which the 80/20 arms need there (docs/ablation.md), for every arm of a GPU recipe alike
ENGINE_WORKERS = ("trainer.use_legacy_worker_impl=disable",)


@pytest.mark.skipif(VERL != "0.7.1", reason="the arms are verl keys both stacks declare alike; a preflight per arm "
                                            "runs on verl 0.7.1's stack")
@pytest.mark.parametrize("recipe", [*CPU, *QWEN3])
def test_every_entropy_method_arm_composes_with_every_recipe(recipe, demo, workdir, monkeypatch):
    """The arms of --arms entropy_methods with a seed's overrides, as the ablation runs them, on each recipe: the
    start-up checks pass, and the arm's method is in the config the run gets; the whole preflight runs each arm on
    one CPU and one GPU recipe (the others differ from those in sizes only)."""
    from egpo.ablation import ARM_SETS, ARMS, seed_overrides
    from egpo.settings import EgpoSettings
    from egpo.preflight.findings import refuse
    from egpo.preflight.key_check import check_unknown_keys
    from egpo.preflight.token_selection import check_token_selection

    monkeypatch.chdir(workdir)
    for arm in ARM_SETS["entropy_methods"]:
        engine = () if recipe in CPU else ENGINE_WORKERS
        overrides = [*overrides_for(recipe, demo), *engine, *ARMS[arm], *seed_overrides(1)]
        cfg = composed(recipe, overrides)
        refuse(check_unknown_keys(cfg))
        settings = EgpoSettings.from_algorithm(cfg.algorithm)
        if recipe in CPU and settings.selects_tokens:
            # on a CPU verl 0.7.1's engine forward is bf16 whatever the FSDP config says: the 80/20 rule needs 0.9.1
            with pytest.raises(EgpoConfigError, match="Fix: trainer.use_legacy_worker_impl=disable"):
                refuse(check_token_selection(*with_facts(cfg, settings=settings)))
            continue
        refuse(check_token_selection(*with_facts(cfg, settings=settings)))
        for override in ARMS[arm]:
            key, value = override.split("=", 1)
            assert str(OmegaConf.select(cfg, key)) == value, (arm, key)
        if recipe in ("cpu_warm", "qwen3_1.7b"):
            status, lines = run(str(RECIPES), recipe, overrides)
            assert status == 0, (arm, findings_text(lines))


@pytest.mark.parametrize("arm", ["grpo_vllm", "egpo_actor_vllm", "egpo_rollout_vllm", "egpo_rollout_bypass_vllm"])
def test_the_vllm_arms_of_the_gpu_recipes_pass_the_preflight(arm, demo, workdir, monkeypatch):
    """Each vLLM arm with a seed's overrides, as the ablation runs it, where a vLLM egpo patches is installed."""
    from egpo.ablation import ARM_SETS, ARMS, seed_overrides
    from egpo.rollout.vllm import versions

    assert arm in ARM_SETS["vllm_sources"]
    monkeypatch.setattr(versions, "installed_vllm", lambda: "0.24.0")
    status, lines = qwen3(workdir, demo, monkeypatch, *ARMS[arm], *seed_overrides(3))
    assert status == 0, findings_text(lines)


@pytest.mark.parametrize("version, note", [("0.24.0", None), ("0.30.0", "between vllm 0.29.0 and 0.32.0")])
def test_the_preflight_says_which_tested_vllm_versions_bracket_an_untested_one(demo, workdir, monkeypatch, version,
                                                                              note):
    from egpo.ablation import ARMS
    from egpo.rollout.vllm import versions

    monkeypatch.setattr(versions, "installed_vllm", lambda: version)
    status, lines = qwen3(workdir, demo, monkeypatch, *ARMS["egpo_rollout_vllm"])
    text = findings_text(lines)
    assert status == 0, text
    assert ("is not itself tested" in text) is (note is not None)
    if note:
        assert f"vllm {version} is not itself tested" in text and note in text


def test_a_vllm_arm_that_reads_rollout_entropy_without_vllm_is_refused(demo, workdir, monkeypatch):
    from egpo.ablation import ARMS
    from egpo.rollout.vllm import versions

    monkeypatch.setattr(versions, "installed_vllm", lambda: None)
    status, lines = qwen3(workdir, demo, monkeypatch, *ARMS["egpo_rollout_vllm"])
    assert status != 0 and "vllm is not installed" in findings_text(lines)
    status, lines = qwen3(workdir, demo, monkeypatch, *ARMS["egpo_actor_vllm"])  # verl's own vLLM replica: no refusal
    assert status == 0, findings_text(lines)


def test_the_preflight_reports_the_gpu_paths_a_config_takes(demo, workdir, monkeypatch):
    """The actor entropy's precision, replicas sharing one engine seed, and a reward model's own server: each seen
    before the first GPU hour."""
    status, lines = qwen3(workdir, demo, monkeypatch)
    text = findings_text(lines)
    assert status == 0 and "the actor's entropy (the bonus) is computed in fp32" in text
    assert "one engine seed" not in text
    # 8 GPUs, tensor parallel 2: four sglang replicas sharing one seed
    status, lines = qwen3(workdir, demo, monkeypatch, "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                          "++actor_rollout_ref.rollout.engine_kwargs.sglang.random_seed=1")
    text = findings_text(lines)
    assert status == 0 and "gives all 4 rollout replicas one engine seed" in text
    assert "~actor_rollout_ref.rollout.engine_kwargs.sglang.random_seed" in text
    # the padded bf16 path: refused at start-up with its fixes
    status, lines = qwen3(workdir, demo, monkeypatch, "actor_rollout_ref.model.use_remove_padding=false")
    assert status != 0 and "computed in bf16" in findings_text(lines)


def test_a_reward_models_server_is_named_verls_own(demo, workdir, monkeypatch):
    from conftest import VERL
    from egpo.preflight.engines import side_model_findings

    prefix = "reward." if VERL == "0.9.1" else ""
    cfg = composed("qwen3_1.7b", [*overrides_for("qwen3_1.7b", demo), f"{prefix}reward_model.enable=true",
                                  f"{prefix}reward_model.rollout.name=sglang"])
    assert [f.text for f in side_model_findings(cfg)] == [
        "the reward model's server (sglang) is verl's own: no entropy patches, log probs or egpo refusals (those are "
        "for the policy's rollout)"]


def test_print_config_shows_the_config_egpo_starts(demo, workdir, monkeypatch, capsys):
    """``--print-config``: after the findings, the prepared configuration as YAML: egpo's settings applied (the fp32
    chunked entropy uncompiled, the think-token ids, egpo's manager), the update-time entropy left off."""
    import yaml

    from egpo.preflight.__main__ import main
    from egpo.rollout.agent_loop import MANAGER_PATH

    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit) as exit_status:
        main([f"--config-path={RECIPES}", "--config-name=qwen3_1.7b", "--print-config",
              *overrides_for("qwen3_1.7b", demo)])
    assert exit_status.value.code == 0
    out = capsys.readouterr().out
    head, _, body = out.partition("# the configuration python -m egpo.main would start, with egpo's settings applied\n")
    assert "0 error(s)" in head and body
    cfg = yaml.safe_load(body)
    actor = cfg["actor_rollout_ref"]["actor"]
    assert actor["calculate_entropy"] is False and actor["entropy_from_logits_with_chunking"] is True
    assert actor["fsdp_config"]["use_torch_compile"] is False
    assert cfg["algorithm"]["cot_start_token_id"] is not None
    assert cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] == MANAGER_PATH
    assert cfg["data"]["train_files"] == str(workdir / "data" / "math_train.parquet")  # resolved as the run resolves it


def test_the_8020_rule_on_a_micro_batch_token_mean_is_refused_and_the_fix_passes(demo, workdir, monkeypatch):
    """verl 0.7.1's legacy actor takes a token mean per micro-batch: the 80/20 rule's kept tokens would be weighted by
    their micro-batch's kept count. Refused there, naming verl's engine workers, which take the batch's mean (as verl
    0.9.1's do); the fix passes pasted. At quantile 1 the mask is GRPO's own, so nothing is refused."""
    from egpo.ablation import ARMS

    status, lines = qwen3(workdir, demo, monkeypatch, *ARMS["grpo_8020"])
    text = findings_text(lines)
    refused = "divides the loss of each micro-batch by that micro-batch's own kept tokens" in text
    assert refused is (VERL == "0.7.1") and status == int(refused), text
    if refused:
        fix = re.search(r"Fix: (\S+)", text).group(1)
        assert fix == "trainer.use_legacy_worker_impl=disable"
        status, lines = qwen3(workdir, demo, monkeypatch, *ARMS["grpo_8020"], fix)
        assert status == 0, findings_text(lines)
    status, lines = qwen3(workdir, demo, monkeypatch, *ARMS["grpo_8020"], "algorithm.egpo_top_entropy_quantile=1.0")
    assert status == 0 and "own kept tokens" not in findings_text(lines)
    status, lines = qwen3(workdir, demo, monkeypatch, *ARMS["grpo"])
    assert "own kept tokens" not in findings_text(lines)


def test_every_problem_of_a_config_is_listed_each_on_its_line_offline_too(demo, workdir, monkeypatch):
    """Several problems at once (a misspelled key, an unknown entropy source, a hub model this machine cannot
    reach): every one is listed, each on its line, within seconds, and the checks that do not depend on them still
    run (the data files, the batch arithmetic)."""
    import time

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens, as offline
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.monotonic()
    status, lines = qwen3(workdir, demo, monkeypatch, "+algorithm.egpo_lamda=0.3", "algorithm.entropy_source=engine",
                          "actor_rollout_ref.model.path=egpo-test/no-such-model")
    elapsed = time.monotonic() - start
    errors = [line for line in lines if line.startswith("X ")]
    assert status == 1 and elapsed < 30, (elapsed, lines)
    assert any("did you mean algorithm.egpo_lambda?" in line for line in errors), lines
    assert any("algorithm.entropy_source='engine' is not one of" in line for line in errors), lines
    assert any("egpo-test/no-such-model is not in this machine's Hugging Face cache and the hub (127.0.0.1:9)" in line
               for line in errors), lines
    assert any(line.startswith("  ") and "data" in line for line in lines[1:]), lines  # data checks still ran
    assert lines[-1] == f"{len(errors)} error(s), {sum(line.startswith('! ') for line in lines)} warning(s)"


def test_a_local_model_path_with_a_typo_is_named(demo, workdir, monkeypatch):
    status, lines = qwen3(workdir, demo, monkeypatch, f"actor_rollout_ref.model.path={demo / 'modle'}")
    assert status == 1
    assert any(f"actor_rollout_ref.model.path={demo / 'modle'} is no folder on this machine" in line for line in lines)


def test_verls_validation_inside_the_preflight_prints_nothing_of_its_own():
    """verl's validate_config, run by the preflight before Ray, would print its 'All configuration checks passed'
    (just before a refusal of egpo's) and the critic warning egpo silences everywhere else: neither reaches the
    preflight's output."""
    import contextlib
    import io
    import warnings
    from pathlib import Path

    from egpo.preflight.batch import verl_validate_findings
    from egpo.preflight.compose import compose

    config = compose(str(Path(__file__).resolve().parent.parent / "recipes"), "cpu_smoke", [], echo=lambda _: None)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert verl_validate_findings(config) == []
    assert printed.getvalue() == "" and [str(w.message) for w in caught] == []


@pytest.mark.parametrize("budget, found", [(256, True), (512, False)])
def test_vllms_prefill_budget_under_its_context_without_chunked_prefill(demo, workdir, monkeypatch, budget, found):
    """vLLM without chunked prefill: on verl 0.7.1 vLLM refuses the pair at engine start (an error here, before Ray);
    verl 0.9.1 raises the budget to the context itself (a warning). The context is the model's (the demo model's
    max_position_embeddings, 512, as qwen3() points the recipe at it); the fix, pasted, clears it."""
    chunked_off = ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.enable_chunked_prefill=false")
    _, lines = qwen3(workdir, demo, monkeypatch, *chunked_off, f"actor_rollout_ref.rollout.max_num_batched_tokens={budget}")
    text = findings_text(lines)
    said = (f"max_num_batched_tokens={budget} is under the engine's context of 512 (the model's "
            "max_position_embeddings, verl's max_model_len when it is unset)")
    assert (said in text) == found, text
    if not found:
        return
    line = next(line for line in lines if said in line)
    assert line.startswith("X " if VERL == "0.7.1" else "! "), line
    fix = ("actor_rollout_ref.rollout.max_model_len=512", "actor_rollout_ref.rollout.max_num_batched_tokens=512")
    assert " ".join(fix) in line
    for fixed in (fix, ("actor_rollout_ref.rollout.enable_chunked_prefill=true",)):
        _, lines = qwen3(workdir, demo, monkeypatch, *chunked_off, f"actor_rollout_ref.rollout.max_num_batched_tokens="
                         f"{budget}", *fixed)
        assert "max_num_batched_tokens" not in findings_text(lines), fixed


def _loss_config(*overrides):
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name="qwen3_4b", overrides=list(overrides))


def test_grpo_s_without_its_loss_or_with_another_aggregation_is_warned_with_the_fix():
    from egpo.preflight.policy_loss import check_policy_loss

    found = check_policy_loss(*with_facts(_loss_config("algorithm.egpo_method=grpo_s")))
    assert [f.level for f in found] == ["warning"]
    assert ("actor_rollout_ref.actor.policy_loss.loss_mode=grpo_s "
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean") in found[0].text
    found = check_policy_loss(*with_facts(_loss_config("algorithm.egpo_method=grpo_s",
                                           "actor_rollout_ref.actor.policy_loss.loss_mode=grpo_s")))
    assert "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean (now 'token-mean')" in found[0].text
    assert not [f for f in found if f.level != "fact" and "averages over responses" not in f.text]
    assert check_policy_loss(*with_facts(_loss_config())) == []  # verl's own loss, EGPO: nothing to say


def test_the_grpo_s_loss_reaches_the_workers_on_each_stack():
    """verl 0.9.1 imports egpo's verl.plugins entry point in every process: nothing is set. verl 0.7.1 has no plugin
    group: Ray's worker setup hook is set, and a run's own hook is refused (Ray runs one)."""
    from egpo.preflight.policy_loss import HOOK, HOOK_KEY, check_policy_loss

    loss = ("actor_rollout_ref.actor.policy_loss.loss_mode=grpo_s",
            "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean", "algorithm.egpo_method=grpo_s")
    config = _loss_config(*loss)
    found = check_policy_loss(*with_facts(config))
    if VERL == "0.9.1":
        assert found == [] and OmegaConf.select(config, HOOK_KEY, default=None) is None
        from importlib.metadata import entry_points

        assert "egpo.advantage.loss_plugin" in {ep.value for ep in entry_points(group="verl.plugins")}
        return
    assert OmegaConf.select(config, HOOK_KEY) == HOOK and [f.level for f in found] == ["fact"]
    found = check_policy_loss(*with_facts(_loss_config(*loss, f"++{HOOK_KEY}=mypkg.setup")))
    assert [f.level for f in found] == ["error"] and "call egpo.advantage.loss_plugin.setup() at the start" in \
        found[0].text
