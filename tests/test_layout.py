"""The dependency direction the layout promises (docs/layout.md): every room of egpo (a top-level module or package)
sits on a floor, and imports only rooms on lower floors, lazy imports included, so no two rooms import each other.
advantage/ imports nothing of egpo's but errors; rollout/ never imports trainer/ (the names both share live below
both, in egpo/keys.py and egpo/settings.py); compat/ (verl's table) sits below rollout/, trainer/ and preflight/;
preflight/ (everything the driver does before Ray) below the entry points, and never reaches into trainer/ (the
trainer process)."""

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
    ("preflight", ("egpo.main", "egpo.ablation", "egpo.report", "egpo.trainer")),  # before Ray, below the entry points
    ("compat", ("egpo.rollout", "egpo.trainer", "egpo.preflight", "egpo.main", "egpo.cpu", "egpo.probe")),  # verl's table
    # the reading tools read a run on disk (runs/), never through the tools that wrote it
    ("analyze", ("egpo.main", "egpo.generate", "egpo.ablation", "egpo.rehearse", "egpo.report")),
    ("runs", ("egpo.main", "egpo.generate", "egpo.ablation", "egpo.rehearse", "egpo.analyze", "egpo.trainer")),
])
def test_dependency_direction(folder, forbidden):
    offenders = {str(p.relative_to(PACKAGE)): sorted(m for m in egpo_imports(p) if m.startswith(forbidden))
                 for p in (PACKAGE / folder).rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


# lowest first; a room imports only rooms on floors below its own
FLOORS = (
    ("errors", "entropy_sources", "engines", "recipe_names", "significance", "typos", "process_tree",  # shared
     "runner_console"),
    ("keys", "patching", "advantage", "runs", "options"),  # runs/: a run on disk; options: egpo.*, egpo_demo.*, ...
    ("settings", "folders"),
    ("compat", "analyze"),  # compat/: verl's table; analyze/: a reading tool, below every running one
    ("rollout", "probe", "report"),  # rollout/: the engines, where rollout entropy is born; report: a reading tool
    ("cpu", "console", "trainer"),  # trainer/: the trainer process
    ("demo", "runner"),
    ("preflight",),  # the driver before Ray
    ("main", "generate", "rehearse", "ablation", "data"),  # the running tools and entry points, side by side
)


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "egpo" else None


def test_every_room_is_on_a_floor_and_imports_only_the_floors_below():
    floor = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}
    rooms = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | \
        {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "config"}
    assert rooms == set(floor), ("rooms without a floor", rooms - set(floor), "floors without a room", set(floor) - rooms)
    upward = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        room = rel.parts[0].removesuffix(".py")
        if room == "__init__":
            continue
        for imported in egpo_imports(path):
            target = _room(imported)
            if target in floor and target != room and floor[target] >= floor[room]:
                upward.append(f"{rel} imports {imported} (floor {floor[target]} from floor {floor[room]})")
    assert not upward, upward


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_cycle_between_egpos_modules():
    """Every import, lazy ones included: no module reaches itself (a cycle makes import order part of the contract)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in egpo_imports(path):
            while imported and imported not in modules:  # "from egpo.x import name": the module egpo.x
                imported = imported.rpartition(".")[0]
            if imported and imported != name and not name.startswith(imported + "."):  # a package's own __init__
                targets.add(imported)
        graph[name] = targets
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_every_egpo_error_is_one_of_three_kinds():
    """Each ``...Error`` class egpo defines is a config refusal, an incompatible dependency or a runtime entropy
    problem (egpo.errors), so a caller can tell them apart by kind."""
    import importlib

    from egpo.errors import EgpoConfigError, EntropyError, IncompatibleDependencyError

    kinds = (EgpoConfigError, IncompatibleDependencyError, EntropyError)
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error") and path.name != "errors.py":
                found[node.name] = _module_name(path)
    assert len(found) >= 14
    strays = {}
    for name, module in found.items():
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:  # an engine this environment lacks (sglang or vLLM)
            continue
        if not issubclass(cls, kinds):
            strays[name] = module
    assert not strays


TEST_ONLY = ("pytest", "hypothesis", "_pytest", "xdist")


def test_the_package_imports_nothing_only_the_tests_install():
    """egpo runs where pytest is not installed (README's GPU install has no test extra): no module of egpo's imports
    pytest or another test tool, lazily or not; what only the tests need lives in tests/."""
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            found = [n for n in names if n.split(".")[0] in TEST_ONLY]
            if found:
                offenders.setdefault(str(path.relative_to(PACKAGE)), []).extend(found)
    assert not offenders, offenders


def test_the_report_reads_runs_without_the_tools_that_wrote_them():
    running = ("egpo.main", "egpo.generate", "egpo.ablation", "egpo.rehearse", "egpo.trainer")
    assert not {m for m in egpo_imports(PACKAGE / "report.py") if m.startswith(running)}
