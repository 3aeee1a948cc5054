"""The pass's one list of steps (egpo.preflight.checks) and the run's facts (egpo.preflight.run_facts): every step
takes (config, run), the facts are read once a pass, and a fact that cannot be read skips the steps that need it,
named in one warning, instead of stopping the pass."""

from __future__ import annotations

import inspect
import sys

import pytest
from hydra import compose, initialize_config_dir

from egpo.engines import load
from egpo.preflight.checks import NEEDS, STEPS, WHEN
from egpo.preflight.prepare import prepare
from test_recipes import RECIPES


def recipe(name: str, *overrides: str):
    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name=name, overrides=list(overrides))


def test_every_step_takes_the_config_and_the_runs_facts():
    """One signature for every step (and every ``applies``), each target importable, no step listed twice."""
    assert len({step.what for step in STEPS}) == len(STEPS)
    for step in STEPS:
        assert step.when in WHEN and set(step.needs) <= set(NEEDS)
        for target in filter(None, (step.run, step.applies)):
            inspect.signature(load(target)).bind("config", "run")  # raises TypeError where it does not


def _counting(functions):
    """A profiler counting the calls of each function (by its code, however it was imported)."""
    codes = {fn.__code__: name for name, fn in functions.items()}
    counts = dict.fromkeys(functions, 0)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            counts[codes[frame.f_code]] += 1

    return counts, profile


@pytest.mark.parametrize("name, overrides", [
    ("cpu_smoke", ()),
    ("qwen3_1.7b", ()),
    ("cpu_smoke", ("algorithm.entropy_source=surprisal", "++actor_rollout_ref.rollout.calculate_log_probs=true",
                   "++algorithm.egpo_token_selection=top_entropy", "++algorithm.egpo_top_entropy_quantile=0.2",
                   "++egpo.probe.enable=true")),
])
def test_the_pass_reads_each_fact_once(name, overrides, tmp_path):
    """A whole pass (every step, the figures and the prompt lengths) reads the installed verl, the worker family and
    the rollout's name once, in egpo.preflight.run_facts; every check takes them from there."""
    from egpo.compat.versions import verl_version
    from egpo.compat.workers import worker_family, workers
    from egpo.preflight.actor_entropy import actor_entropy_keys
    from egpo.settings import rollout_name

    extra = (f"egpo_demo.out={tmp_path / 'demo'}",) if name == "cpu_smoke" else ()
    config = recipe(name, *extra, *overrides)
    counts, profile = _counting({"verl_version": verl_version, "worker_family": worker_family, "workers": workers,
                                 "rollout_name": rollout_name, "actor_entropy_keys": actor_entropy_keys})
    sys.setprofile(profile)
    try:
        prepared = prepare(config, preflight="all", echo=lambda _: None)
    finally:
        sys.setprofile(None)
    assert prepared.run.verl is not None and prepared.run.settings is not None
    assert counts == {"verl_version": 1, "worker_family": 1, "workers": 0, "rollout_name": 1,
                      "actor_entropy_keys": 0}, counts


def _skipped(findings, topic):
    lines = [f.text for f in findings if f.level == "warning" and f.text.startswith("not completed or checked: ")
             and f.topic == topic]
    assert len(lines) <= 1, lines
    return lines[0].split(": ", 1)[1].rsplit(": ", 1)[0].split("; ") if lines else []


def test_refused_settings_skip_the_steps_that_read_them_in_one_warning(tmp_path):
    """algorithm.* refused: the pass goes on, the refusal is one error, and the steps that read the settings are
    named, in their order, in one warning; none of them ran (egpo's agent-loop manager is not set)."""
    from egpo.preflight.rollout_path import MANAGER_KEY
    from omegaconf import OmegaConf

    config = recipe("cpu_smoke", f"egpo_demo.out={tmp_path / 'demo'}", "algorithm.egpo_lambda=-1")
    prepared = prepare(config, preflight="all", echo=lambda _: None)
    errors = [f for f in prepared.findings if f.level == "error"]
    # the data files are the demo's, which waits for the refusal to be fixed
    assert [f.topic for f in errors if f.topic != "data"] == ["algorithm"] and "egpo_lambda" in errors[0].text
    assert prepared.settings is None
    needing = [step.what for step in STEPS if "settings" in step.needs]
    assert _skipped(prepared.findings, "algorithm") == needing
    assert OmegaConf.select(prepared.config, MANAGER_KEY, default=None) is None
    # the demo waits for the refusal to be fixed, and the markers for the demo: each named once, under its need
    assert _skipped(prepared.findings, "demo") == ["the demo model"]


def test_an_untested_verl_is_one_refusal_and_the_pass_goes_on(monkeypatch, tmp_path):
    """A verl egpo is not tested with: one refusal naming the tested ones, the steps that read verl's table named
    in one warning, and every other finding still reported (python -m egpo.preflight lists them all)."""
    from egpo.compat import versions

    monkeypatch.setattr(versions, "version", lambda name: "0.8.0" if name == "verl" else "0")
    config = recipe("qwen3_1.7b")
    prepared = prepare(config, preflight="all", echo=lambda _: None)
    stack = [f for f in prepared.findings if f.topic == "stack" and f.level == "error"]
    assert len(stack) == 1 and "tested with verl 0.7.1 and 0.9.1; this environment has verl 0.8.0" in stack[0].text
    assert _skipped(prepared.findings, "stack") == [step.what for step in STEPS if "stack" in step.needs]
    assert any(f.topic == "step" for f in prepared.findings)  # the figures that need no verl are still there


def test_egpo_mains_pass_stops_before_the_figures_on_a_refusal(tmp_path):
    """python -m egpo.main's pass: a start-up refusal leaves the figures out (they would only repeat it); with none,
    the figures run and a figure's error is the one refusal that names egpo.preflight."""
    refused = prepare(recipe("cpu_smoke", f"egpo_demo.out={tmp_path / 'demo'}", "algorithm.egpo_lambda=-1"),
                      echo=lambda _: None)
    assert not any(f.topic in ("step", "scale", "data") for f in refused.findings)
    said = []
    passed = prepare(recipe("cpu_smoke", f"egpo_demo.out={tmp_path / 'demo'}"), echo=said.append)
    assert not [f for f in passed.findings if f.level == "error"]
    assert any(line.startswith("[egpo preflight]") and " step " in line for line in said)
    short = prepare(recipe("cpu_smoke", f"egpo_demo.out={tmp_path / 'demo'}", "data.train_batch_size=100000"),
                    echo=lambda _: None)
    [only] = [f for f in short.findings if f.level == "error"]
    assert only.topic == "preflight" and "fewer than data.train_batch_size=100000" in only.text
    assert "python -m egpo.preflight lists every finding" in only.text
