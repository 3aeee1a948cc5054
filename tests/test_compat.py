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
