"""egpo.compat.entry on the installed verl: the runner egpo extends, and the guard when verl's shape changes."""

import pytest

from egpo.compat import entry
from egpo.compat.versions import verl_version


def test_the_installed_verls_runner_is_a_plain_class_that_builds_the_trainer_by_name():
    found = entry.verl_entry()
    assert found.version == verl_version()
    assert isinstance(found.task_runner, type) and not hasattr(found.task_runner, "remote")
    assert found.runner_module.__name__ == entry.RUNNER_MODULE[found.version]
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
