"""Start-up checks of the rollout-entropy path and of the CPU backend, on composed configs."""

import re
from pathlib import Path

import pytest

from conftest import VERL
from sglang_required import require_sglang
from hydra import compose, initialize_config_dir

from egpo.settings import EgpoConfigError, EgpoSettings
from egpo.preflight.key_check import EGPO_ALGORITHM_KEYS
from egpo.preflight.cpu_backend import SGLANG_CPU_ENGINE, check_cpu_backend
from egpo.preflight.findings import refuse
from egpo.preflight.rollout_path import MANAGER_KEY, check_rollout_entropy_path, select_agent_loop_manager
from test_recipes import RECIPES
from egpo.preflight.run_facts import with_facts

STOCK_MANAGER = "verl.experimental.agent_loop.AgentLoopManager"


def smoke(*overrides):
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name="cpu_smoke", overrides=list(overrides))


def checks(cfg):
    """What egpo.main runs before Ray starts, in its order."""
    settings = EgpoSettings.from_algorithm(cfg.algorithm, rollout_name=cfg.actor_rollout_ref.rollout.name)
    refuse(check_cpu_backend(*with_facts(cfg)))
    select_agent_loop_manager(*with_facts(cfg, settings=settings))
    refuse(check_rollout_entropy_path(*with_facts(cfg, settings=settings)))


@pytest.mark.parametrize("source", ["actor", "rollout", "surprisal"])
def test_cpu_smoke_recipe_passes(source):
    checks(smoke(f"algorithm.entropy_source={source}"))


def test_rollout_entropy_without_egpos_manager_is_refused_with_the_fix():
    cfg = smoke("algorithm.entropy_source=rollout", "actor_rollout_ref.rollout.name=sglang", "trainer.device=cuda",
                f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={STOCK_MANAGER}")
    with pytest.raises(EgpoConfigError, match="agent_loop_manager_class=egpo.rollout.agent_loop.EntropyAgentLoopManager"):
        checks(cfg)
    # actor entropy does not need it
    checks(smoke("actor_rollout_ref.rollout.name=sglang", "trainer.device=cuda",
                 f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={STOCK_MANAGER}"))


def test_surprisal_without_the_rollouts_log_probs_is_refused_and_the_fix_passes():
    """entropy_source=surprisal reads verl's rollout log probs (verl 0.7.1 keeps none by default): refused before Ray
    with the override that turns them on, which passes pasted; no engine patch or egpo manager is needed for it."""
    off = ("algorithm.entropy_source=surprisal", "actor_rollout_ref.rollout.calculate_log_probs=false")
    with pytest.raises(EgpoConfigError, match=r"Fix: \+\+actor_rollout_ref\.rollout\.calculate_log_probs=true\.") as err:
        checks(smoke(*off))
    checks(smoke(*off, *err.value.fixes[0]))
    checks(smoke("algorithm.entropy_source=surprisal", "actor_rollout_ref.rollout.name=sglang", "trainer.device=cuda",
                 f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={STOCK_MANAGER}"))


def test_hf_rollout_needs_egpos_manager_and_the_cpu():
    with pytest.raises(EgpoConfigError, match=r"needs \+\+actor_rollout_ref.rollout.agent.agent_loop_manager_class"):
        checks(smoke(f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={STOCK_MANAGER}"))
    with pytest.raises(EgpoConfigError, match="set trainer.device=cpu"):
        checks(smoke("trainer.device=cuda"))


def test_cpu_device_lists_every_missing_setting():
    cfg = smoke(
        "actor_rollout_ref.rollout.name=trtllm",
        "~actor_rollout_ref.model.override_config.attn_implementation",
        "~ray_kwargs.ray_init.num_gpus",
        "~ray_kwargs.ray_init.resources",
    )
    with pytest.raises(EgpoConfigError) as err:
        refuse(check_cpu_backend(*with_facts(cfg)))
    message = str(err.value)
    for fix in ("rollout.name=hf, sglang or vllm", "attn_implementation=eager", "ray_init.num_gpus=1", "resources={cpu:1}"):
        assert fix in message


def pasted_fixes(message: str) -> list[str]:
    """The ``++key=value`` overrides an error message suggests, as a user would paste them."""
    return re.findall(r"\+\+\S+=(?:\{[^}]*\}|[^\s;.(]+(?:\.[^\s;.(]+)*)", message)


@pytest.mark.parametrize("rollout", ["hf", "sglang"])
def test_every_cpu_fix_works_when_pasted_verbatim(rollout):
    removed = ["~actor_rollout_ref.model.override_config.attn_implementation", "~ray_kwargs.ray_init.num_gpus",
               "~ray_kwargs.ray_init.resources"]
    if rollout == "sglang":
        require_sglang()
        removed += [f"~actor_rollout_ref.rollout.engine_kwargs.sglang.{key}" for key in SGLANG_CPU_ENGINE]
    with pytest.raises(EgpoConfigError) as err:
        refuse(check_cpu_backend(*with_facts(smoke(f"actor_rollout_ref.rollout.name={rollout}", *removed))))
    fixes = pasted_fixes(str(err.value))
    assert len(fixes) == len(removed), (fixes, str(err.value))
    # on a recipe that lacks the keys and on one that has them (++ adds or overrides)
    checks(smoke(f"actor_rollout_ref.rollout.name={rollout}", *removed, *fixes))
    checks(smoke(f"actor_rollout_ref.rollout.name={rollout}", *fixes))


@pytest.mark.skipif(VERL != "0.7.1", reason="verl 0.7.1's engine workers (trainer.use_legacy_worker_impl=disable)")
def test_verl_071s_engine_workers_on_cpu_need_fsdp2_and_the_fix_works_pasted():
    with pytest.raises(EgpoConfigError) as err:
        checks(smoke("trainer.use_legacy_worker_impl=disable"))
    fixes = pasted_fixes(str(err.value))
    assert fixes == ["++actor_rollout_ref.actor.fsdp_config.strategy=fsdp2"], str(err.value)
    checks(smoke("trainer.use_legacy_worker_impl=disable", *fixes))


def test_sglang_on_cpu_needs_its_engine_settings():
    with pytest.raises(EgpoConfigError, match="free_cache_engine=false"):
        refuse(check_cpu_backend(*with_facts(smoke("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.free_cache_engine=true"))))
    with pytest.raises(EgpoConfigError, match=r"engine_kwargs.sglang.device=cpu"):
        refuse(check_cpu_backend(*with_facts(smoke("actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.engine_kwargs.sglang.device=cuda"))))


def test_rollout_entropy_from_an_engine_that_returns_none_is_refused_before_ray():
    cfg = smoke("algorithm.entropy_source=rollout", "actor_rollout_ref.rollout.name=trtllm", "trainer.device=cuda")
    with pytest.raises(EgpoConfigError, match="rollout.name=trtllm returns no per-token entropy.*rollout.name=sglang"):
        checks(cfg)
    checks(smoke("actor_rollout_ref.rollout.name=trtllm", "trainer.device=cuda"))  # actor entropy: fine


@pytest.fixture
def installed_vllm(monkeypatch):
    """Sets the vLLM version the start-up checks read from package metadata."""
    from egpo.rollout.vllm import versions

    def install(version):
        monkeypatch.setattr(versions, "installed_vllm", lambda: version)

    return install


@pytest.mark.parametrize("version", ["0.12.0", "0.24.0", "0.29.0", "0.33.0", "0.30.0"])
def test_vllm_rollout_entropy_runs_on_the_versions_egpo_patches(installed_vllm, version):
    installed_vllm(version)
    checks(smoke("algorithm.entropy_source=rollout", "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"))


@pytest.mark.parametrize("version, found", [(None, "vllm is not installed"), ("0.11.0", "vllm 0.11.0 is installed"),
                                            ("0.34.0", "vllm 0.34.0 is installed")])
def test_vllm_rollout_entropy_on_another_vllm_is_refused_before_ray(installed_vllm, version, found):
    installed_vllm(version)
    cfg = smoke("algorithm.entropy_source=rollout", "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda")
    with pytest.raises(EgpoConfigError, match=rf"needs vllm 0.12.0; 0.24.0 to 0.33.0.*{found}.*pip install vllm==0.12.0 "
                                              r"with verl 0.7.1.*\+\+algorithm.entropy_source=actor") as err:
        checks(cfg)
    [fix] = err.value.fixes
    checks(smoke("algorithm.entropy_source=rollout", "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda", *fix))
    # what does not read the rollout's entropy keeps verl's own vLLM replica, on any vLLM
    checks(smoke("actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"))
    checks(smoke("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"))


@pytest.mark.parametrize("override, message", [
    ("++actor_rollout_ref.rollout.engine_kwargs.vllm.speculative_config={method:ngram}", "speculative_config"),
    ("++actor_rollout_ref.rollout.engine_kwargs.vllm.max_logprobs=-1", "max_logprobs=-1"),
    ("actor_rollout_ref.rollout.pipeline_model_parallel_size=2", "pipeline_model_parallel_size=2"),
])
def test_vllm_entropy_limits_are_checked_at_start_up(installed_vllm, override, message):
    installed_vllm("0.24.0")
    base = ("algorithm.entropy_source=rollout", "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda")
    with pytest.raises(EgpoConfigError, match=rf"{re.escape(message)}.*\+\+algorithm.entropy_source=actor") as err:
        checks(smoke(*base, override))
    [fix] = err.value.fixes
    checks(smoke(*base, override, *fix))


def test_the_model_runner_egpo_does_not_patch_is_refused_at_start_up(installed_vllm, monkeypatch):
    """vLLM 0.12.0's Model Runner V2 (opt-in there) has a sampler egpo does not patch; from 0.24.0 egpo serves it."""
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    config = smoke("algorithm.entropy_source=rollout", "actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda")
    installed_vllm("0.12.0")
    with pytest.raises(EgpoConfigError, match="VLLM_USE_V2_MODEL_RUNNER=1.*unset it"):
        checks(config)
    installed_vllm("0.24.0")
    checks(config)


@pytest.mark.parametrize("override, message", [
    ("actor_rollout_ref.rollout.data_parallel_size=2", "data_parallel_size=2"),
    ("actor_rollout_ref.rollout.pipeline_model_parallel_size=2", "pipeline_model_parallel_size=2"),
    # verl spreads engine_kwargs.sglang last into sglang's arguments: the same limits through that route
    ("++actor_rollout_ref.rollout.engine_kwargs.sglang.dp_size=2", "engine_kwargs.sglang.dp_size=2"),
    ("++actor_rollout_ref.rollout.engine_kwargs.sglang.pp_size=2", "engine_kwargs.sglang.pp_size=2"),
    ("++actor_rollout_ref.rollout.engine_kwargs.sglang.enable_dp_attention=true", "enable_dp_attention=True"),
    ("++actor_rollout_ref.rollout.engine_kwargs.sglang.speculative_algorithm=EAGLE", "speculative_algorithm=EAGLE"),
    ("++actor_rollout_ref.rollout.engine_kwargs.sglang.speculative_draft_model_path=/m", "speculative_draft_model_path"),
])
def test_sglang_entropy_limits_are_checked_at_start_up(override, message):
    from egpo.rollout.sglang.limits import _data_parallel_reaches_schedulers, _installed_targets

    cfg = smoke("actor_rollout_ref.rollout.name=sglang", "trainer.device=cuda", override)
    if "dp_size" in override or "data_parallel_size" in override:
        if _data_parallel_reaches_schedulers(_installed_targets()):  # installed sglang (0.5.12) runs dp with entropy
            checks(cfg)
            return
    with pytest.raises(EgpoConfigError, match=message) as err:
        checks(cfg)
    removal = re.findall(r"\(~(\S+)\)", str(err.value))
    if override.startswith("++"):  # the suggested removal, pasted, clears the refusal
        assert removal == [override[2:].split("=")[0]]
        checks(smoke("actor_rollout_ref.rollout.name=sglang", "trainer.device=cuda", override, f"~{removal[0]}"))


@pytest.mark.parametrize("value", ["1", "null", "false"])
def test_harmless_engine_kwargs_values_pass(value):
    key = "dp_size" if value == "1" else ("speculative_algorithm" if value == "null" else "enable_dp_attention")
    checks(smoke("actor_rollout_ref.rollout.name=sglang", "trainer.device=cuda",
                 f"++actor_rollout_ref.rollout.engine_kwargs.sglang.{key}={value}"))


@pytest.mark.parametrize("override, suggestion", [
    ("+algorithm.egpo_lamda=0.3", "did you mean algorithm.egpo_lambda?"),
    ("+algorithm.entropy_sorce=rollout", "did you mean algorithm.entropy_source?"),
    ("+algorithm.norm_adv_by_std_in_grp=false", "did you mean algorithm.norm_adv_by_std_in_grpo?"),
    ("+egpo.prob.enable=true", "did you mean egpo.probe?"),
    ("+egpo.probe.atribution=true", "did you mean egpo.probe.attribution?"),
    ("+algorithm.egpo_token_selecton=top_entropy", "did you mean algorithm.egpo_token_selection?"),
    ("+egpo.pass_at_k.solved=1.0", "did you mean egpo.pass_at_k.solved_score?"),
    ("+egpo.pass_at_k.solved_score=full", "egpo.pass_at_k.solved_score must be a number"),
])
def test_misspelled_keys_are_refused_with_the_closest_key(override, suggestion):
    from egpo.preflight.key_check import check_unknown_keys

    with pytest.raises(EgpoConfigError) as err:
        refuse(check_unknown_keys(smoke(override)))
    assert suggestion in str(err.value)


def test_every_key_of_the_shipped_configs_is_known():
    from egpo.preflight.key_check import check_unknown_keys

    refuse(check_unknown_keys(smoke()))
    refuse(check_unknown_keys(smoke("++algorithm.egpo_token_selection=top_entropy", "++algorithm.egpo_top_entropy_quantile=0.1",
                             "++egpo.pass_at_k.solved_score=3")))
    for name in sorted(p.stem for p in RECIPES.glob("*.yaml")):
        with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
            refuse(check_unknown_keys(compose(config_name=name)))


@pytest.mark.parametrize("override, nearest", [
    ("+algorithm.egpo_lamda=0.3", "algorithm.egpo_lambda"), ("algorithm.egpo_lamda=0.3", "algorithm.egpo_lambda"),
    ("++algorithm.egpo_lamda=0.3", "algorithm.egpo_lambda"), ("egpo.probe.atribution=true", "egpo.probe.attribution"),
    ("~algorithm.egpo_lamda", "algorithm.egpo_lambda"), ("egpo.prob.enable=true", "egpo.probe"),
])
def test_a_misspelled_key_on_the_command_line_gets_the_nearest_key_with_or_without_plus(override, nearest):
    from egpo.preflight.key_check import misspelled_override_problems

    [problem] = misspelled_override_problems(["--config-name=cpu_smoke", override, "algorithm.egpo_lambda=0.3",
                                              "+algorithm.rollout_correction.bypass_mode=true", "trainer.device=cpu"])
    assert f"did you mean {nearest}?" in problem


def test_a_misspelled_key_stops_the_main_job_before_ray(tmp_path):
    """Without + (where Hydra alone would suggest appending the misspelled key with +): egpo answers with the nearest
    key in one try, as its own line, without a traceback, before anything is built."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "egpo.main", f"--config-path={RECIPES}", "--config-name=cpu_smoke",
                           f"egpo_demo.out={tmp_path / 'demo'}", "algorithm.egpo_lamda=0.3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "did you mean algorithm.egpo_lambda?" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "To append to your config use" not in proc.stderr
    assert "ray init kwargs" not in proc.stdout + proc.stderr  # verl prints it just before ray.init
    assert not (tmp_path / "demo").exists()  # refused before anything was built


def test_every_refusal_of_the_main_job_is_listed_as_egpos_lines_before_anything_is_built(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "egpo.main", f"--config-path={RECIPES}", "--config-name=cpu_smoke",
                           f"egpo_demo.out={tmp_path / 'demo'}", "algorithm.entropy_source=engine",
                           "~ray_kwargs.ray_init.num_gpus"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    lines = lines[lines.index("[egpo] refused before anything started: 2 problems:"):]  # after verl's import warnings
    assert lines[1].startswith("X algorithm  algorithm.entropy_source='engine' is not one of")
    assert lines[2].startswith("X cpu        trainer.device=cpu needs: ++ray_kwargs.ray_init.num_gpus=1")
    assert "Traceback" not in proc.stderr and not (tmp_path / "demo").exists()
    # nothing was started, and nothing is left: no Hydra outputs/ folder, no run directory made for Hydra's files
    assert sorted(p.name for p in tmp_path.iterdir()) == [], sorted(p.name for p in tmp_path.iterdir())


def flat(node: dict, prefix: str = "") -> dict:
    """Nested dict -> {"a.b.c": leaf}."""
    out = {}
    for key, value in node.items():
        path = f"{prefix}{key}"
        out.update(flat(value, path + ".") if isinstance(value, dict) and value else {path: value})
    return out


# egpo's keys, and trainer.use_v1=false: egpo trains through verl's RayPPOTrainer (0.9.1 defaults to its v1 trainer)
EGPO_OWN = (*(f"algorithm.{key}" for key in EGPO_ALGORITHM_KEYS), "actor_rollout_ref.rollout.custom", "egpo.",
            "trainer.use_v1")


@pytest.mark.parametrize("rollout", ["sglang", "vllm"])
def test_grpo_through_egpo_is_verls_run(rollout):
    """Same overrides through verl's ppo_trainer and egpo's trainer config: the same config apart from egpo's keys,
    and after egpo's start-up selection verl's own agent-loop manager (no egpo replica, order or tool loop)."""
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    overrides = ["algorithm.adv_estimator=grpo", f"actor_rollout_ref.rollout.name={rollout}",
                 "actor_rollout_ref.model.path=/models/Qwen3-1.7B", "actor_rollout_ref.rollout.n=8"]
    with initialize_config_module("verl.trainer.config", version_base=None):
        verl_cfg = compose(config_name="ppo_trainer", overrides=overrides)
    with initialize_config_module("egpo.config", version_base=None):
        egpo_cfg = compose(config_name="egpo_trainer", overrides=overrides)
    checks(egpo_cfg)
    assert egpo_cfg.trainer.use_v1 is False
    assert OmegaConf.select(egpo_cfg, MANAGER_KEY, default=None) is None
    ours = {k: v for k, v in flat(OmegaConf.to_container(egpo_cfg)).items() if not k.startswith(EGPO_OWN)}
    theirs = {k: v for k, v in flat(OmegaConf.to_container(verl_cfg)).items() if not k.startswith(EGPO_OWN)}
    assert ours == theirs, {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)}


def test_egpo_and_the_hf_rollout_select_egpos_manager():
    from omegaconf import OmegaConf

    from egpo.rollout.agent_loop import MANAGER_PATH

    for overrides in (("actor_rollout_ref.rollout.name=sglang", "trainer.device=cuda"),  # egpo estimator
                      ("algorithm.adv_estimator=grpo",)):  # GRPO on the CPU's hf rollout
        cfg = smoke(*overrides)
        checks(cfg)
        assert OmegaConf.select(cfg, MANAGER_KEY) == MANAGER_PATH


def megatron(*overrides):
    from hydra import initialize_config_module

    with initialize_config_module("egpo.config", version_base=None):
        return compose(config_name="egpo_megatron_trainer", overrides=["algorithm.adv_estimator=egpo", *overrides])


def test_megatron_config_composes_with_egpos_keys_and_checks():
    import subprocess
    import sys

    from egpo.preflight.key_check import check_unknown_keys

    cfg = megatron("algorithm.entropy_source=rollout", "actor_rollout_ref.rollout.name=sglang")
    assert cfg.actor_rollout_ref.actor.strategy == "megatron"
    refuse(check_unknown_keys(cfg))
    checks(cfg)  # egpo's manager selected, sglang's limits checked
    proc = subprocess.run([sys.executable, "-m", "egpo.main", "--config-name=egpo_megatron_trainer", "--cfg", "job",
                           "algorithm.adv_estimator=egpo", "algorithm.egpo_lambda=0.3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "egpo_lambda: 0.3" in proc.stdout and "strategy: megatron" in proc.stdout


def test_the_probe_is_refused_on_megatron():
    from egpo.preflight.prepare import pass_probe_settings_to_workers

    with pytest.raises(EgpoConfigError, match="egpo.probe.enable=false"):
        refuse(pass_probe_settings_to_workers(*with_facts(megatron("egpo.probe.enable=true"))))
    refuse(pass_probe_settings_to_workers(*with_facts(megatron())))


@pytest.mark.skipif(VERL != "0.7.1", reason="verl 0.7.1's engine workers (trainer.use_legacy_worker_impl=disable)")
def test_the_probe_is_refused_on_verl_071s_engine_workers():
    from egpo.preflight.prepare import pass_probe_settings_to_workers

    with pytest.raises(EgpoConfigError, match="hooks no verl 0.7.1 engine worker"):
        refuse(pass_probe_settings_to_workers(*with_facts(smoke("egpo.probe.enable=true", "trainer.use_legacy_worker_impl=disable"))))
    refuse(pass_probe_settings_to_workers(*with_facts(smoke("egpo.probe.enable=true"))))


USER_CONFIG = Path(__file__).resolve().parent / "data" / "user_config"
EGPO_ON_ANY_CONFIG = ("algorithm.adv_estimator=egpo", "++algorithm.entropy_source=rollout", "++algorithm.egpo_lambda=0.4")


def test_a_users_multi_turn_config_gets_egpo_by_overrides():
    """README's overrides on a config egpo has never seen: composes, passes every check, selects egpo's manager
    (whose worker maps verl's tool_agent loop to egpo's per-turn entropy loop)."""
    import subprocess
    import sys

    from omegaconf import OmegaConf

    from egpo.rollout.agent_loop import MANAGER_PATH
    from egpo.preflight.key_check import check_unknown_keys

    with initialize_config_dir(config_dir=str(USER_CONFIG), version_base=None):
        cfg = compose(config_name="multiturn_grpo", overrides=list(EGPO_ON_ANY_CONFIG))
    refuse(check_unknown_keys(cfg))
    checks(cfg)
    assert OmegaConf.select(cfg, MANAGER_KEY) == MANAGER_PATH
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "tool_agent"
    proc = subprocess.run([sys.executable, "-m", "egpo.main", f"--config-path={USER_CONFIG}",
                           "--config-name=multiturn_grpo", "--cfg", "job", *EGPO_ON_ANY_CONFIG],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "adv_estimator: egpo" in proc.stdout and "entropy_source: rollout" in proc.stdout


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("source", ["actor", "rollout"])
@pytest.mark.parametrize("bypass", ["false", "true"])
def test_every_suggested_fix_passes_the_whole_config(installed_vllm, engine, source, bypass):
    """A refusal's fixes account for the whole config: each offered alternative, pasted, passes every check (vllm
    with bypass mode once led from one refusal to the other and back)."""
    installed_vllm("0.24.0")
    base = ("trainer.device=cuda", f"actor_rollout_ref.rollout.name={engine}", f"algorithm.entropy_source={source}",
            f"algorithm.rollout_correction.bypass_mode={bypass}")
    try:
        checks(smoke(*base))
    except EgpoConfigError as err:
        assert err.fixes, f"a refusal without fixes: {err}"
        for fix in err.fixes:
            assert " ".join(fix) in str(err)
            checks(smoke(*base, *fix))
    else:
        assert not (source == "actor" and bypass == "true")


def test_stack_refusals_name_their_fix(monkeypatch):
    """What a stack's egpo cannot run is refused before Ray (tested on both stacks: the rules are per version)."""
    from egpo.engines import HF, SGLANG
    from egpo.preflight import stack
    from egpo.rollout.sglang import versions

    cfg = smoke("++trainer.use_v1=true", "++egpo.probe.enable=true", "actor_rollout_ref.rollout.name=sglang",
                "++actor_rollout_ref.rollout.multi_turn.enable=true")
    monkeypatch.setattr(versions, "installed_sglang", lambda: "0.5.12")
    [only] = stack.stack_problems(cfg, "0.7.1", SGLANG)  # verl 0.7.1 has no use_v1; its sglang is another
    assert "sglang 0.5.6.post2 (the one verl 0.7.1 pins); this environment has sglang 0.5.12" in only
    problems = " ".join(stack.stack_problems(cfg, "0.9.1", SGLANG))
    assert "probe" not in problems and "multi_turn" not in problems and "sglang" not in problems  # all run there
    assert "set ++trainer.use_v1=false" in problems
    monkeypatch.setattr(versions, "installed_sglang", lambda: "0.5.6.post2")
    assert "pip install --no-deps sglang==0.5.12 && pip install -r .ci/sglang-0.5.12-cpu-requirements.txt" in " ".join(
        stack.stack_problems(cfg, "0.9.1", SGLANG))
    assert stack.stack_problems(smoke(), "0.9.1", HF) == []  # the CPU main job (trainer.device=cpu, hf rollout) runs there
    # the suggested use_v1 fix, pasted, clears that refusal
    assert not any("use_v1" in p for p in stack.stack_problems(smoke("++trainer.use_v1=true", "++trainer.use_v1=false"), "0.9.1", HF))


@pytest.mark.parametrize("version", ["0.7.1", "0.9.1"])
def test_a_gpu_run_without_flash_attn_is_stated_with_the_install_line_and_sdpa(version, monkeypatch):
    """verl loads the actor with flash_attention_2 unless the config names another attention; without the flash_attn
    package that fails on every worker after Ray started them. Stated before: an error on a machine with a GPU, a
    warning on one without (the run may go to GPU nodes of their own image), naming verl's extra that brings it and
    sdpa; the sdpa override, pasted, clears it; a CPU run and a run with flash_attn installed get none."""
    import importlib.util

    from egpo.compat import versions
    from egpo.preflight import stack

    on = {"verl": version, "stack": versions.VERL[version]}  # the stack whose install line is stated
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else real(name, *a))
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        qwen = compose(config_name="qwen3_4b")
        finding = stack.attention_finding(*with_facts(qwen, cuda=True, **on))
        assert finding.level == "error" and stack.attention_finding(*with_facts(qwen, cuda=False, **on)).level == "warning"
        fix = re.search(r"instead: (\S+)$", finding.text).group(1)
        assert fix == "++actor_rollout_ref.model.override_config.attn_implementation=sdpa"
        assert f"Fix: {versions.VERL[version].flash_attn_install} (PyPI has its source only" in finding.text
        assert versions.VERL[version].flash_attn_install.startswith("MAX_JOBS=") and "==" in finding.text  # pinned
        assert stack.attention_finding(*with_facts(compose(config_name="qwen3_4b", overrides=[fix]), cuda=True, **on)) is None
    assert stack.attention_finding(*with_facts(smoke(), cuda=True, **on)) is None  # trainer.device=cpu
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a))
    assert stack.attention_finding(*with_facts(qwen, cuda=True, **on)) is None


def test_an_untested_verl_stops_start_up_naming_the_tested_ones(monkeypatch):
    from egpo.compat import versions

    monkeypatch.setattr(versions, "version", lambda name: "0.8.0")
    with pytest.raises(versions.UnsupportedVerlError, match=r"tested with verl 0\.7\.1 and 0\.9\.1; this environment has verl 0\.8\.0"):
        versions.verl_version()


@pytest.mark.parametrize("version", ["0.7.1", "0.9.1"])
def test_a_recipes_rollout_engine_that_is_not_installed_is_stated_before_ray_with_its_install_line(version,
                                                                                                   monkeypatch):
    """The qwen3 recipes roll out with sglang; verl imports it only as its workers start, after the actor loaded on
    every GPU. Without it: an error where the run's workers would run from this environment (a GPU here, or a CPU
    run), a warning where they may not (no GPU here), with the line that installs the engine beside this verl; an
    installed engine, or egpo's own hf rollout, gets none."""
    from egpo.compat import versions
    from egpo.preflight import stack
    from egpo.rollout.sglang import versions as sglang_versions
    from egpo.rollout.vllm import versions as vllm_versions

    on = {"verl": version, "stack": versions.VERL[version]}  # the stack whose install lines are stated
    monkeypatch.setattr(sglang_versions, "installed_sglang", lambda: "not installed")
    monkeypatch.setattr(vllm_versions, "installed_vllm", lambda: None)
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        qwen = compose(config_name="qwen3_4b")
        on_vllm = compose(config_name="qwen3_4b", overrides=["actor_rollout_ref.rollout.name=vllm"])
    line = versions.VERL[version].gpu_engine_install["sglang"]
    found = stack.engine_installed_finding(*with_facts(qwen, cuda=True, **on))
    assert found.level == "error" and found.topic == "engine"
    assert found.text.startswith("actor_rollout_ref.rollout.name=sglang, and sglang is not installed here")
    assert found.text.endswith(f"Fix (verl {version} on a GPU): {line}")
    assert stack.engine_installed_finding(*with_facts(qwen, cuda=False, **on)).level == "warning"
    assert stack.engine_installed_finding(*with_facts(on_vllm, cuda=True, **on)).text.endswith(
        f"Fix (verl {version} on a GPU): pip install vllm=={versions.VERL[version].vllm}")
    cpu_sglang = stack.engine_installed_finding(*with_facts(smoke("actor_rollout_ref.rollout.name=sglang"), **on))
    assert cpu_sglang.level == "error" and cpu_sglang.text.endswith(
        f"Fix (a CPU run): {sglang_versions.install_line(versions.VERL[version].sglang)}")
    assert stack.engine_installed_finding(*with_facts(smoke(), **on)) is None  # egpo's own hf rollout
    monkeypatch.setattr(sglang_versions, "installed_sglang", lambda: versions.VERL[version].sglang)
    assert stack.engine_installed_finding(*with_facts(qwen, cuda=True, **on)) is None



def test_fsdp1_on_a_cpu_is_refused_before_ray_with_fsdp2():
    """verl's FSDP1 (actor.strategy=fsdp, the qwen3 recipes' own) syncs the module's states through a GPU device and
    fails on a CPU only once its workers build the model; refused before, naming FSDP2, and the fix passes."""
    from egpo.preflight.cpu_backend import check_cpu_backend

    [found] = check_cpu_backend(*with_facts(smoke("actor_rollout_ref.actor.strategy=fsdp")))
    assert "actor_rollout_ref.actor.strategy=fsdp2 (FSDP1, strategy=fsdp" in found.text
    assert check_cpu_backend(*with_facts(smoke("actor_rollout_ref.actor.strategy=fsdp2"))) == []
