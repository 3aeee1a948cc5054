"""egpo.patching: the one way egpo puts code around another project's methods, against hand-built targets; and the
rule that every engine patch and verl hook goes through it."""

import ast
import inspect
import sys
import types
from pathlib import Path

import pytest

from egpo.errors import IncompatibleDependencyError
from egpo.patching import MARK, Patch, parameters, remove_all, resolve

PACKAGE = Path(__file__).resolve().parent.parent / "egpo"


@pytest.fixture
def target_module(monkeypatch):
    """A throwaway module ``egpo_patch_target`` with a class, a subclass and a function."""
    module = types.ModuleType("egpo_patch_target")

    class Base:
        def step(self, x, scale=2):
            return x * scale

    class Child(Base):
        pass

    def top(a, b):
        return a - b

    module.Base, module.Child, module.top = Base, Child, top
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def plus_one(original, self, x, *args, **kwargs):
    return original(self, x, *args, **kwargs) + 1


def test_the_wrapper_receives_the_original_and_applies_once(target_module):
    patch = Patch("egpo_patch_target:Base.step", plus_one)
    original = target_module.Base.step
    assert not patch.applied() and patch.original() is original
    patch.apply()
    patch.apply()  # idempotent: not wrapped twice
    assert target_module.Base().step(5) == 11 and target_module.Base().step(5, scale=3) == 16
    assert patch.applied() and patch.original() is original
    assert getattr(target_module.Base.step, MARK) is patch and target_module.Base.step.__wrapped__ is original
    patch.remove()
    assert target_module.Base.step is original and target_module.Base().step(5) == 10
    patch.remove()  # removing twice is a no-op


def test_a_patched_target_reads_as_its_original_for_shape_checks(target_module):
    patch = Patch("egpo_patch_target:Base.step", plus_one)
    before = parameters(target_module.Base.step)
    patch.apply()
    assert before == ("x", "scale") == parameters(target_module.Base.step)
    assert inspect.signature(target_module.Base.step) == inspect.signature(patch.original())
    patch.remove()


def test_an_inherited_method_is_shadowed_and_removing_restores_inheritance(target_module):
    patch = Patch("egpo_patch_target:Child.step", plus_one)
    patch.apply()
    assert target_module.Child().step(1) == 3 and target_module.Base().step(1) == 2
    patch.remove()
    assert "step" not in vars(target_module.Child) and target_module.Child().step(1) == 2


def test_a_module_function_and_a_group_removed_in_reverse(target_module):
    top = Patch("egpo_patch_target:top", lambda original, a, b: original(a, b) * 10)
    step = Patch("egpo_patch_target:Base.step", plus_one)
    for patch in (top, step):
        patch.apply()
    assert target_module.top(5, 3) == 20 and target_module.Base().step(1) == 3
    remove_all((top, step))
    assert target_module.top(5, 3) == 2 and not hasattr(target_module.Base.step, MARK)


def test_two_patches_on_one_target_nest_and_unwind(target_module):
    inner = Patch("egpo_patch_target:Base.step", plus_one)
    outer = Patch("egpo_patch_target:Base.step", lambda original, self, x: original(self, x) * 100)
    inner.apply()
    wrapped_once = target_module.Base.step
    outer.apply()
    assert target_module.Base().step(1) == 300
    assert outer.original() is wrapped_once and inner.original() is wrapped_once.__wrapped__
    assert inner.applied() and outer.applied()
    inner.apply()  # already in place under the outer one: nothing changes
    assert target_module.Base().step(1) == 300
    with pytest.raises(RuntimeError, match="remove them first"):
        inner.remove()
    remove_all((inner, outer))
    assert not hasattr(target_module.Base.step, MARK) and target_module.Base().step(1) == 2


def test_a_missing_target_names_what_is_missing(target_module):
    with pytest.raises(IncompatibleDependencyError, match=r"egpo_patch_target\.Base\.gone does not exist; see X"):
        resolve("egpo_patch_target:Base.gone", advice="; see X")
    absent = Patch("egpo_no_such_module:Thing.method", plus_one)  # a target this version does not have
    assert not absent.applied()
    absent.remove()  # nothing was applied: nothing to undo
    with pytest.raises(IncompatibleDependencyError, match="egpo_no_such_module cannot be imported"):
        absent.apply()
    with pytest.raises(IncompatibleDependencyError, match="egpo_no_such_module cannot be imported"):
        absent.original()
    with pytest.raises(ValueError, match="package.module:Qual.name"):
        Patch("egpo_patch_target.Base.step", plus_one)


def _assigned_attributes_of_imported_classes(path: Path) -> list[str]:
    """``X.attr = ...`` and ``setattr(X, ...)`` where X is a name imported from verl, sglang or vllm."""
    tree = ast.parse(path.read_text())
    foreign = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in {"verl", "sglang", "vllm"}:
            foreign |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            foreign |= {alias.asname or alias.name for alias in node.names
                        if alias.name.split(".")[0] in {"verl", "sglang", "vllm"}}
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id in foreign \
                    and not target.attr.isupper():  # constants are settings, not code
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {target.value.id}.{target.attr}")
    return found


def test_no_module_keeps_its_own_patch_bookkeeping():
    """Every wrapper egpo puts around verl, sglang or vLLM code goes through egpo.patching: no saved-originals dict,
    no remove_* of a patch module, no method of an imported class assigned by hand (sglang's process entries, which
    sglang pickles by name, and the CPU-only stand-ins are the named exceptions)."""
    exceptions = {"rollout/sglang/process_entries.py", "rollout/sglang/standins.py", "cpu"}
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = str(path.relative_to(PACKAGE))
        if rel == "patching.py" or any(rel == e or rel.startswith(e + "/") for e in exceptions):
            continue
        text = path.read_text()
        for marker in ("_originals", '_state["original', "__egpo_wraps__", "def remove_"):
            if marker in text:
                offenders.append(f"{rel}: {marker}")
        offenders += _assigned_attributes_of_imported_classes(path)
    assert not offenders
