import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# Ray starts no idle workers ahead of need in the tests' runs and clusters (every actor of a run gets a process of its
# own anyway): on 2 cores the prestarted ones only slow each run's start (about 7 s a run, measured 2026-11-26)
os.environ.setdefault("RAY_enable_worker_prestart", "0")
# Tests run several at a time (pytest-xdist, .ci/run) share the cores: each worker's torch and OpenMP, and the
# processes its tests start, get their share, not every core each (oversubscribed, OpenMP's threads spin against
# each other's work)
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # this process's
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    share = CORES // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, share)))

from egpo.compat.versions import verl_version  # noqa: E402

VERL = verl_version()

# README's test command, `python -m pytest -q`, on the whole suite: two tests at a time (pytest-xdist) on a machine of
# 4 cores or more, the end-to-end runs one after another on one worker (each is a chain of processes: a Ray cluster,
# verl's workers, an engine), every other test on the other; one at a time on fewer cores, where a second worker only
# makes the processes of both wait on each other (README's lane in CI, beside CI's other lanes on 2 cores, measured
# 2026-11-29: two at a time 48 min, one at a time 34 min). A run that names its tests, or its own -n, is left as given.
WORKERS = 2 if CORES >= 4 else 1
E2E_GROUP = "e2e"


def failed_run(proc, tail: int = 3000) -> str:
    """What a failed subprocess said, for an assertion's message: the first error block of its stderr and stdout
    (a traceback, or a line naming an error, with what follows it), then the ends of both. A run's own error is often
    followed by pages of a dying cluster's lines that push it out of the ends alone."""
    import re

    found = []
    for name, text in (("stderr", proc.stderr or ""), ("stdout", proc.stdout or "")):
        match = re.search(r"Traceback \(most recent call last\)|\b\w+(Error|Exception)\b: ", text)
        if match:
            start = text.rfind("\n", 0, max(0, match.start() - 500)) + 1
            found.append(f"--- the first error in {name} ---\n{text[start:match.start() + 3000]}")
    return "\n".join([*found, f"--- stdout's end ---\n{(proc.stdout or '')[-tail:]}",
                       f"--- stderr's end ---\n{(proc.stderr or '')[-tail:]}"])


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns -n into its workers
def pytest_cmdline_main(config):
    option = config.option
    if hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER"):
        return None  # a worker of a run already two at a time (xdist calls this hook in each worker too)
    if (not config.pluginmanager.hasplugin("xdist") or getattr(option, "numprocesses", None) is not None
            or option.collectonly or getattr(option, "dist", "no") != "no"
            or config.args_source is not pytest.Config.ArgsSource.TESTPATHS):
        return None
    if WORKERS > 1:
        option.numprocesses, option.dist = WORKERS, "loadgroup"
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist's hook, in the run that starts the workers: whether this run groups its tests. A worker reads ``--dist``
    from the command line alone, so a default the suite set in code (above) reaches it only this way."""
    node.workerinput["egpo_loadgroup"] = node.config.option.dist == "loadgroup"


def pytest_configure(config):
    if getattr(config, "workerinput", {}).get("egpo_loadgroup"):
        config.option.loadgroup = True  # what the worker's collection reads to put each test in its group


@pytest.hookimpl(tryfirst=True)  # before the xdist worker's own, which reads the group into each test's id
def pytest_collection_modifyitems(config, items):
    for item in items:  # with --dist loadgroup, every end-to-end run on one worker, one after another
        if item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.xdist_group(E2E_GROUP))


def bare_sglang_server(cls, **config):
    """An instance of verl's sglang server class (or egpo's) without launching anything: the attributes verl's
    ``generate`` reads, on either verl (0.9.1 adds the PD-disaggregation role, the replica rank, LoRA and MTP
    checks)."""
    from types import SimpleNamespace

    server = object.__new__(cls)
    server.config = SimpleNamespace(enable_rollout_routing_replay=False, skip_tokenizer_init=True, mtp=None, **config)
    server._disaggregation_role, server.replica_rank = "null", 0
    server.model_config = SimpleNamespace(lora_rank=0, lora={})
    return server


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo model, tokenizer and task, built once for every end-to-end run of the session."""
    from egpo.demo.build import build

    return build(tmp_path_factory.mktemp("egpo_demo"))


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory, demo):
    """One uninterrupted ablation run (tests/ablation_runs.py), the reference every interrupted one must end as."""
    from ablation_runs import uninterrupted, with_demo_data

    return uninterrupted(with_demo_data(tmp_path_factory.mktemp("uninterrupted"), demo))
