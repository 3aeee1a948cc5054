"""egpo.compat.entry on the installed verl: the runner egpo extends, and the guard when verl's shape changes."""

import pytest

from egpo.compat import entry
from egpo.compat.versions import verl_stack, verl_version


def test_the_installed_verls_runner_is_a_plain_class_that_builds_the_trainer_by_name():
    found = entry.verl_entry()
    assert found.version == verl_version()
    assert isinstance(found.task_runner, type) and not hasattr(found.task_runner, "remote")
    assert found.runner_module.__name__ == verl_stack(found.version).runner_module
    original = found.runner_module.RayPPOTrainer

    class Marker:
        pass

    try:
        found.install_trainer(Marker)
        assert found.runner_module.RayPPOTrainer is Marker
    finally:
        found.install_trainer(original)


def test_a_runner_that_no_longer_builds_the_trainer_by_name_fails_naming_the_version(monkeypatch):
    runner = entry.verl_entry().task_runner

    def run(self, config):
        return config

    monkeypatch.setattr(runner, "run", run)
    with pytest.raises(entry.VerlEntryShapeError, match=rf"verl {verl_version()}: .*TaskRunner.run no longer builds"):
        entry.verl_entry()


def test_each_verls_engine_pins_are_tested_versions_of_the_engine_tables():
    """The verl table states which sglang and vLLM each verl pins; the engine tables hold a tested entry for each,
    and their messages name the pins from it."""
    from egpo.compat.versions import NEXT_VERL_PINS, VERL
    from egpo.rollout.sglang import versions as sglang_versions
    from egpo.rollout.vllm import versions as vllm_versions

    for verl, stack in VERL.items():
        assert stack.sglang in sglang_versions.TARGETS and stack.vllm in vllm_versions.TARGETS
        assert sglang_versions.stack_name(stack.sglang) == f"verl {verl}"
        assert f"pip install vllm=={stack.vllm} with verl {verl}" in vllm_versions.INSTALL
    assert NEXT_VERL_PINS["sglang"] in sglang_versions.TARGETS and NEXT_VERL_PINS["vllm"] in vllm_versions.TARGETS
    assert sglang_versions.STACK_PINS == tuple(stack.sglang for stack in VERL.values())


def test_an_untested_verl_and_a_reshaped_verl_hook_name_every_tested_verls_install(monkeypatch):
    """The install advice is built from the verl table (no message names one verl as the only one)."""
    from egpo.compat import versions
    from egpo.trainer import advantage_step

    monkeypatch.setattr(versions, "version", lambda name: "0.6.0")
    with pytest.raises(versions.UnsupportedVerlError) as refused:
        versions.verl_version()
    monkeypatch.undo()
    monkeypatch.setattr(advantage_step, "_EXPECTED_PARAMS", ("data",))
    with pytest.raises(advantage_step.VerlShapeError) as reshaped:
        advantage_step._check_verl_shape()
    for text in (str(refused.value), str(reshaped.value)):
        for verl, stack in versions.VERL.items():
            assert f"{stack.install} (verl {verl}, {stack.note})" in text
        assert "Pin verl==" not in text


def test_this_environment_runs_verls_trainer_and_a_mismatch_is_named_before_any_import(monkeypatch):
    """From package metadata alone: a transformers the installed verl cannot run and an import verl's trainer makes
    without declaring it are each named with the pip line that fixes them."""
    import importlib.util

    from egpo.compat import versions

    assert versions.environment_problems() == []
    stack = versions.verl_stack()
    installed = versions.version
    monkeypatch.setattr(versions, "version", lambda name: "4.0.0" if name == "transformers" else installed(name))
    [problem] = versions.environment_problems()
    assert f"transformers{stack.transformers}" in problem and "has transformers 4.0.0" in problem
    assert f"pip install 'transformers{stack.transformers}'" in problem
    monkeypatch.undo()
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else find_spec(name, *a))
    problems = versions.environment_problems()
    if "uvicorn" in stack.undeclared_imports:
        assert problems == [f"verl {versions.verl_version()}'s trainer imports uvicorn, which verl does not declare "
                            "and this environment lacks: pip install uvicorn"]
    else:
        assert problems == []


def test_egpo_declares_what_each_verls_trainer_imports_and_pins_the_transformers_it_runs_with():
    """pyproject.toml against the verl table: the stack extras pin the table's transformers, the base dependencies
    hold every import a tested verl's trainer makes without declaring it (so `pip install -e .` into an existing verl
    environment runs)."""
    import tomllib
    from pathlib import Path

    from egpo.compat.versions import VERL

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    base = {dep.split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip() for dep in project["dependencies"]}
    for verl, stack in VERL.items():
        extra = project["optional-dependencies"]["verl" + verl.replace(".", "")]
        assert f"verl=={verl}" in extra and f"transformers{stack.transformers}" in extra
        assert set(stack.undeclared_imports) <= base
