"""README's test command, ``python -m pytest -q``, runs two tests at a time on 4 cores or more (tests/conftest.py).
The suite's own ``pytest_cmdline_main`` sets ``-n 2`` and ``--dist loadgroup``; pytest-xdist turns ``-n`` into its
workers in its own ``pytest_cmdline_main``, so the suite's must be called before xdist's, or the whole suite quietly
runs one test at a time."""

from types import SimpleNamespace

import pytest

import conftest


def test_the_suites_default_is_set_before_xdist_reads_it(request):
    impls = request.config.pluginmanager.hook.pytest_cmdline_main.get_hookimpls()
    called = [impl.function.__module__ for impl in reversed(impls)]  # pluggy calls the last in this list first
    assert "conftest" in called and "xdist.plugin" in called, called
    assert called.index("conftest") < called.index("xdist.plugin"), called


def test_every_end_to_end_run_is_in_the_one_group_its_worker_reads(request):
    """With ``--dist loadgroup`` xdist schedules by the group it wrote into each test's id (``...@e2e``) in its own
    ``pytest_collection_modifyitems``, if the worker knows the run groups (a worker reads ``--dist`` from the command
    line alone, so the suite's default reaches it through its input) and the suite's marker is on the test before that:
    else every end-to-end run is scheduled alone, two of them run side by side and each worker builds the module
    fixtures again."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is None:
        pytest.skip("checked in a run two at a time (README's test command): the groups exist only there")
    assert "egpo_loadgroup" in workerinput  # tests/conftest.py's pytest_configure_node reached this worker
    if not workerinput["egpo_loadgroup"]:
        pytest.skip("this run distributes its tests by another --dist")
    e2e = [item for item in request.session.items if item.get_closest_marker("e2e")]
    if not e2e:
        pytest.skip("no end-to-end run selected")
    assert all(item.nodeid.endswith(f"@{conftest.E2E_GROUP}") for item in e2e), [i.nodeid for i in e2e[:3]]


@pytest.mark.parametrize("workers, expected", [(2, (2, "loadgroup")), (1, (None, "no"))])
def test_the_default_is_two_grouped_workers_on_four_cores_and_one_at_a_time_below(monkeypatch, workers, expected):
    monkeypatch.setattr(conftest, "WORKERS", workers)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    option = SimpleNamespace(numprocesses=None, dist="no", collectonly=False)
    config = SimpleNamespace(option=option, pluginmanager=SimpleNamespace(hasplugin=lambda name: name == "xdist"),
                             args_source=pytest.Config.ArgsSource.TESTPATHS)
    conftest.pytest_cmdline_main(config)
    assert (option.numprocesses, option.dist) == expected
    named = SimpleNamespace(option=SimpleNamespace(numprocesses=None, dist="no", collectonly=False),
                            pluginmanager=config.pluginmanager, args_source=pytest.Config.ArgsSource.ARGS)
    conftest.pytest_cmdline_main(named)  # a run that names its tests is left as given
    assert (named.option.numprocesses, named.option.dist) == (None, "no")
