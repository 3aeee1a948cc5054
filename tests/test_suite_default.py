"""README's test command, ``python -m pytest -q``, runs two tests at a time (tests/conftest.py). The suite's own
``pytest_cmdline_main`` sets ``-n 2`` and ``--dist loadgroup``; pytest-xdist turns ``-n`` into its workers in its own
``pytest_cmdline_main``, so the suite's must be called before xdist's, or the whole suite quietly runs one test at a
time."""

import pytest

import conftest


def test_the_suites_default_is_set_before_xdist_reads_it(request):
    impls = request.config.pluginmanager.hook.pytest_cmdline_main.get_hookimpls()
    called = [impl.function.__module__ for impl in reversed(impls)]  # pluggy calls the last in this list first
    assert "conftest" in called and "xdist.plugin" in called, called
    assert called.index("conftest") < called.index("xdist.plugin"), called


def test_every_end_to_end_run_is_in_the_one_group_its_worker_reads(request):
    """With ``--dist loadgroup`` xdist schedules by the group it wrote into each test's id (``...@e2e``) in its own
    ``pytest_collection_modifyitems``: the suite's marker has to be on the test before that, or every end-to-end run is
    scheduled alone, two of them run side by side and each worker builds the module fixtures again."""
    if not getattr(request.config.option, "loadgroup", False):  # set in xdist's workers only
        pytest.skip("checked in a run two at a time (README's test command): the groups exist only there")
    e2e = [item for item in request.session.items if item.get_closest_marker("e2e")]
    if not e2e:
        pytest.skip("no end-to-end run selected")
    assert all(item.nodeid.endswith(f"@{conftest.E2E_GROUP}") for item in e2e), [i.nodeid for i in e2e[:3]]
