"""Engine versions as tested ranges (egpo.compat.version_ranges and each engine's table), without any engine."""

from types import SimpleNamespace

import pytest

from egpo.compat.version_ranges import bracket_note, candidates, describe

TESTED = ("0.12.0", "0.24.0", "0.29.0", "0.32.0", "0.33.0")
RANGES = (("0.12.0", "0.12.0"), ("0.24.0", "0.33.0"))


@pytest.mark.parametrize("version, expected", [
    ("0.12.0", ("0.12.0",)),                # tested: its own table
    ("0.33.0", ("0.33.0",)),
    ("0.24.1", ("0.24.0", "0.29.0")),       # inside a range: the nearest tested below, then above
    ("0.30.0", ("0.29.0", "0.32.0")),
    ("0.32.0.post1", ("0.32.0", "0.33.0")),
    ("0.13.0", ()),                          # between ranges
    ("0.11.2", ()),                          # below every range
    ("0.33.1", ()),                          # above every range
    ("0.34.0", ()),
    (None, ()), ("not a version", ()),
])
def test_candidates(version, expected):
    assert candidates(version, TESTED, RANGES) == expected


def test_describe_and_the_start_up_note():
    assert describe(RANGES) == "0.12.0; 0.24.0 to 0.33.0"
    assert bracket_note("vllm", "0.33.0", TESTED, RANGES) is None
    assert bracket_note("vllm", "0.34.0", TESTED, RANGES) is None
    note = bracket_note("vllm", "0.30.0", TESTED, RANGES)
    assert "vllm 0.30.0 is not itself tested" in note and "between vllm 0.29.0 and 0.32.0" in note


def test_every_ranges_ends_are_tested_versions():
    from egpo.rollout.sglang import versions as sglang
    from egpo.rollout.vllm import versions as vllm

    for engine in (sglang, vllm):
        assert all(low in engine.TARGETS and high in engine.TARGETS for low, high in engine.RANGES)
        assert all(candidates(v, engine.TARGETS, engine.RANGES) == (v,) for v in engine.TARGETS)


@pytest.mark.parametrize("version, table, v2", [
    ("0.12.0", "0.12.0", False), ("0.24.0", "0.24.0", True), ("0.26.1", "0.24.0", True), ("0.31.0", "0.29.0", True)])
def test_vllm_table_before_import(version, table, v2):
    from egpo.rollout.vllm import versions

    assert versions.vllm_targets(version) is versions.TARGETS[table]
    assert versions.vllm_targets(version).serves_runner_v2 is v2


@pytest.mark.parametrize("version, state", [("0.13.0", "0.13.0 is installed"), ("0.34.0", "0.34.0 is installed"),
                                            (None, "is not installed")])
def test_vllm_outside_the_ranges_is_refused_naming_them(monkeypatch, version, state):
    from egpo.rollout.vllm import versions

    monkeypatch.setattr(versions, "installed_vllm", lambda: version)
    with pytest.raises(versions.VllmPatchTargetError,
                       match=r"needs vllm 0\.12\.0; 0\.24\.0 to 0\.33\.0 \(tested: 0\.12\.0, 0\.24\.0, 0\.29\.0, "
                             rf"0\.32\.0, 0\.33\.0.*vllm {state}.*pip install vllm==0\.12\.0 with verl 0\.7\.1"):
        versions.vllm_targets()


def _entries(scheduler_params, controller_params):
    def function(params):
        namespace = {}
        exec(f"def f({', '.join(params)}): pass", namespace)
        return namespace["f"]

    return {"sglang.srt.managers.scheduler": SimpleNamespace(run_scheduler_process=function(scheduler_params)),
            "sglang.srt.managers.data_parallel_controller": SimpleNamespace(
                run_data_parallel_controller_process=function(controller_params))}


@pytest.mark.parametrize("shape_of", ["0.5.20", "0.5.23"])
def test_an_untested_sglang_inside_the_range_takes_the_table_whose_entries_it_has(monkeypatch, shape_of):
    from egpo.rollout.sglang import versions

    table = versions.TARGETS[shape_of]
    modules = _entries(table.scheduler_entry_params, table.data_parallel_controller_params)
    monkeypatch.setattr(versions, "import_target", modules.__getitem__)
    versions._matching_table.cache_clear()
    try:
        assert versions.sglang_targets("0.5.21") is table
    finally:
        versions._matching_table.cache_clear()


def test_an_untested_sglang_matching_neither_table_is_refused(monkeypatch):
    from egpo.rollout.sglang import versions

    modules = _entries(("server_args", "port_args"), ("server_args",))
    monkeypatch.setattr(versions, "import_target", modules.__getitem__)
    versions._matching_table.cache_clear()
    try:
        with pytest.raises(versions.UnsupportedSglangError,
                           match=r"sglang 0\.5\.22 lies between the tested 0\.5\.20 and 0\.5\.23.*match neither table"):
            versions.sglang_targets("0.5.22")
    finally:
        versions._matching_table.cache_clear()


@pytest.mark.parametrize("version", ["0.5.19", "0.5.24", "0.5.11"])
def test_sglang_outside_the_ranges_is_refused_naming_them(version):
    from egpo.rollout.sglang import versions

    with pytest.raises(versions.UnsupportedSglangError,
                       match=r"supports sglang 0\.5\.6\.post2; 0\.5\.12; 0\.5\.20 to 0\.5\.23 \(tested: .*\); this "
                             rf"environment has sglang {version}"):
        versions.sglang_targets(version)
