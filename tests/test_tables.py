"""Every version fact is on its table and every table covers every tested version; every engine is one descriptor
whose named functions exist (docs/layout.md, 'Adding a verl version' and 'Adding an engine')."""

import dataclasses
import importlib

import pytest

from conftest import VERL
from egpo.compat.verl_shapes import VERL_RELIANCES
from egpo.compat.versions import TESTED_VERL, VerlStack, WorkerFamily
from egpo.compat.versions import VERL as STACKS
from egpo.engines import ENGINES, load


def test_every_version_keyed_table_covers_every_tested_verl():
    assert set(STACKS) == set(TESTED_VERL) == set(VERL_RELIANCES)
    for version, stack in STACKS.items():
        assert all(getattr(stack, f.name) is not None or f.name in ("rollout_seed_key", "empty_server_manager")
                   for f in dataclasses.fields(VerlStack)), version
        # the families verl builds: its engine workers always, its legacy ones where a setting selects them
        assert set(stack.workers) == {"engine", *(("legacy",) if stack.legacy_worker_settings else ())}, version
        assert all(isinstance(family, WorkerFamily) for family in stack.workers.values())


def test_the_installed_verls_workers_are_the_classes_its_table_names():
    for family in STACKS[VERL].workers.values():
        for path in (family.verl_worker, family.cpu_worker, family.probe_worker):
            if path is not None:
                module, _, name = path.rpartition(".")
                assert isinstance(getattr(importlib.import_module(module), name), type), path


def test_no_version_is_compared_inline():
    """A version's facts live on its table: no ``== "0.7.1"`` in egpo's code outside it."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "egpo"
    inline = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py") if p.name != "versions.py"
              for n, line in enumerate(p.read_text().splitlines(), 1)
              if any(f'"{v}"' in line for v in TESTED_VERL) and "VERL_RELIANCES" not in line
              and p.name != "verl_shapes.py"]
    assert not inline, inline


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_each_engine_descriptor_names_what_exists(name):
    engine = ENGINES[name]
    assert engine.name == name
    replica_module, _, replica = engine.replica.partition(":")
    assert replica_module.startswith("egpo.rollout.") and replica
    for target in (engine.limits, engine.cpu_problems):
        if target is not None:
            assert callable(load(target)), target
    if engine.versions is not None:
        table = importlib.import_module(engine.versions)
        assert callable(getattr(table, f"installed_{name}")) and callable(table.untested_note)
    if engine.must_match_verl_pin:
        assert all(getattr(stack, name) for stack in STACKS.values())
        assert callable(importlib.import_module(engine.versions).install_line)


def test_the_engine_lists_are_the_descriptors():
    from egpo.compat.rollout import ONLY_FOR_ROLLOUT_ENTROPY, REGISTERED
    from egpo.compat.seeds import SHARED_ENGINE_SEEDS
    from egpo.settings import ENTROPY_ROLLOUTS

    assert ENTROPY_ROLLOUTS == tuple(REGISTERED) == tuple(ENGINES) == ("hf", "sglang", "vllm")
    assert ONLY_FOR_ROLLOUT_ENTROPY == ("vllm",)
    assert SHARED_ENGINE_SEEDS == {"sglang": "random_seed", "vllm": "seed"}
