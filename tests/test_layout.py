"""The dependency direction the layout promises: advantage/ imports nothing of egpo's but itself; rollout/ never
imports trainer/ (the names both share live below both, in egpo/keys.py and egpo/settings.py)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "egpo"


def egpo_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("egpo")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("egpo"):
            names.add(node.module)
    return names


@pytest.mark.parametrize("folder, forbidden", [
    ("rollout", ("egpo.trainer", "egpo.main", "egpo.probe", "egpo.cpu", "egpo.ablation", "egpo.report")),
    ("advantage", ("egpo.trainer", "egpo.rollout", "egpo.main", "egpo.settings", "egpo.keys", "egpo.probe", "egpo.cpu")),
    ("preflight", ("egpo.main", "egpo.ablation", "egpo.report")),  # everything before Ray, below the entry points
])
def test_dependency_direction(folder, forbidden):
    offenders = {str(p.relative_to(PACKAGE)): sorted(m for m in egpo_imports(p) if m.startswith(forbidden))
                 for p in (PACKAGE / folder).rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


def test_shared_names_sit_below_rollout_and_trainer():
    assert not egpo_imports(PACKAGE / "errors.py")  # below everything
    for name in ("keys.py", "settings.py"):
        assert not {m for m in egpo_imports(PACKAGE / name) if m.startswith(("egpo.trainer", "egpo.rollout"))}


def test_sglangs_children_do_not_import_verl():
    """sglang's scheduler and detokenizer unpickle egpo's process entries: importing them (and with them the egpo
    package) loads the stand-ins and the entropy kernel, not verl."""
    import subprocess
    import sys

    code = ("import sys, egpo.rollout.sglang.process_entries; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'verl', 'ray', 'hydra'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
