"""What README.md and docs/ tell a user to type, read out of the Markdown and checked without running anything long:
every shell command in a fenced block (``bash``, ``sh``, ``shell``), every inline ``python -m egpo...`` command,
every config key and every ``egpo.*`` Python name the text names. tests/test_docs.py runs the checks."""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
FENCE = re.compile(r"^```(bash|sh|shell)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`(python -m egpo[^`]*)`")
# the config trees a doc's keys are looked up in (a key egpo adds is written `++key` in the docs, and not looked up)
CONFIG_ROOTS = ("algorithm", "actor_rollout_ref", "trainer", "data", "ray_kwargs", "critic", "reward_model",
                "custom_reward_function", "egpo.probe")
KEY = re.compile(r"`(\+{0,2})((?:%s)\.[A-Za-z0-9_.]*[A-Za-z0-9_])" % "|".join(re.escape(r) for r in CONFIG_ROOTS))
NAME = re.compile(r"`(egpo(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")
HYDRA_FLAGS = ("--cfg", "--config-path", "--config-name", "-cp", "-cn", "--help", "--hydra-help", "--info",
               "--resolve", "--package", "--multirun")


@dataclass
class Command:
    doc: str
    line: int
    argv: list[str]
    env: dict = field(default_factory=dict)

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {shlex.join(self.argv)}"


def _split(tokens: list[str]) -> list[list[str]]:
    commands, current = [], []
    for token in tokens:
        if token in ("&&", "||", ";", "|"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    return [c for c in [*commands, current] if c]


def shell_commands(path: Path) -> list[Command]:
    """The commands of the fenced shell blocks of a Markdown file, continuation lines joined, ``&&`` chains split,
    comments dropped, leading ``VAR=value`` assignments taken as the command's environment."""
    text = path.read_text()
    found = []
    for block in FENCE.finditer(text):
        first = text[:block.start(2)].count("\n") + 1
        lines = block.group(2).split("\n")
        i = 0
        while i < len(lines):
            start, logical = i, lines[i]
            while logical.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                logical = logical.rstrip()[:-1] + " " + lines[i]
            i += 1
            for argv in _split(shlex.split(logical, comments=True, posix=True)):
                env = {}
                while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
                    key, _, value = argv.pop(0).partition("=")
                    env[key] = value
                if argv:
                    found.append(Command(str(path.relative_to(ROOT)), first + start, argv, env))
    return found


def inline_commands(path: Path) -> list[Command]:
    text = path.read_text()
    return [Command(str(path.relative_to(ROOT)), text[:m.start()].count("\n") + 1, shlex.split(m.group(1)))
            for m in INLINE.finditer(text)]


def config_keys(path: Path) -> list[tuple[int, str]]:
    """(line, key) of every config key the text names, but those written with ``+``/``++`` (keys a run adds); in a
    section titled with a key prefix (``## ... (`algorithm.*`)``), the keys of its tables' first column too."""
    text = path.read_text()
    keys = [(text[:m.start()].count("\n") + 1, m.group(2)) for m in KEY.finditer(text) if not m.group(1)]
    prefix = None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            heading = re.search(r"\(`([a-z_][a-z0-9_.]*)\.\*`\)", line)
            prefix = heading.group(1) if heading else None
        elif prefix and (row := re.match(r"\| `([a-z_][a-z0-9_.]*)` \|", line)):
            keys.append((number, f"{prefix}.{row.group(1)}"))
    return sorted(keys)


def python_names(path: Path) -> list[tuple[int, str]]:
    text = path.read_text()
    return [(text[:m.start()].count("\n") + 1, m.group(1)) for m in NAME.finditer(text)
            if not m.group(1).startswith(("egpo.probe.", "egpo.pass_at_k."))]  # config keys (egpo.preflight.key_check)


# ---------------------------------------------------------------------------------------------------------------
# checks; each raises AssertionError naming the doc, the line and what is wrong


def _path(value: str) -> str:
    return value.replace("$PWD", str(ROOT))


def hydra_args(args: list[str]) -> tuple[str | None, str, list[str]]:
    """(config path, config name, overrides) of an ``egpo.main`` / Hydra command line; ``...`` placeholders left
    out."""
    config_path, config_name, overrides = None, "egpo_trainer", []
    tokens = iter(args)
    for token in tokens:
        key, eq, value = token.partition("=")
        if key in ("--config-path", "-cp"):
            config_path = _path(value if eq else next(tokens))
        elif key in ("--config-name", "-cn"):
            config_name = value if eq else next(tokens)
        elif key == "--cfg":
            next(tokens) if not eq else None
        elif key.startswith("-"):
            assert key in HYDRA_FLAGS, f"{key} is not a flag of egpo.main (Hydra's: {', '.join(HYDRA_FLAGS)})"
        elif token != "...":
            overrides.append(token)
    return config_path, config_name, overrides


def compose_checked(config_path: str | None, config_name: str, overrides: list[str]):
    """The composed config, with egpo's check of its own keys (misspelled ones are refused)."""
    from egpo.preflight.compose import compose
    from egpo.preflight.findings import refuse
    from egpo.preflight.key_check import check_unknown_keys

    if config_path and not Path(config_path).is_dir():  # a placeholder for the user's own config folder
        assert config_path.startswith("/path/to/"), f"--config-path={config_path} does not exist"
        config_path, config_name = None, "egpo_trainer"
    config = compose(config_path, config_name, overrides)
    refuse(check_unknown_keys(config))
    return config


def check_main(args: list[str]) -> None:
    compose_checked(*hydra_args(args))


# where each egpo command's parser() lives
PARSER_MODULES = {"egpo.preflight": "egpo.preflight.__main__", "egpo.ablation": "egpo.ablation.cli",
                  "egpo.generate": "egpo.generate.__main__", "egpo.analyze": "egpo.analyze.__main__",
                  "egpo.rehearse": "egpo.rehearse.__main__"}


def command_parser(module: str):
    """The argument parser of ``python -m module`` (None: the command has none)."""
    import importlib

    imported = importlib.import_module(PARSER_MODULES.get(module, module))
    return imported.parser() if hasattr(imported, "parser") else None


def check_argparse(module: str, args: list[str]):
    try:
        return command_parser(module).parse_args(args)
    except SystemExit as err:
        raise AssertionError(f"python -m {module} refuses these arguments (exit {err.code})") from None


def check_preflight(args: list[str]) -> None:
    parsed = check_argparse("egpo.preflight", args)
    compose_checked(parsed.config_path and _path(parsed.config_path), parsed.config_name, list(parsed.overrides))


def check_ablation(args: list[str]) -> None:
    if args[:1] == ["--status"]:
        assert len(args) == 2, "usage: python -m egpo.ablation --status DIR"
        return
    from egpo.ablation.cli import parse

    try:
        parsed = parse(args)
    except SystemExit as err:
        raise AssertionError(f"python -m egpo.ablation refuses these arguments ({err.code})") from None
    compose_checked(_path(parsed.config_path), parsed.config_name, list(parsed.overrides))


def check_recipe_command(module: str, args: list[str]) -> None:
    """A command that takes a recipe and Hydra overrides (egpo.generate, egpo.rehearse): its parser takes the
    arguments, and the recipe composes with egpo's check of its keys."""
    try:
        parsed = command_parser(module).parse_intermixed_args(args)
    except SystemExit as err:
        raise AssertionError(f"python -m {module} refuses these arguments (exit {err.code})") from None
    compose_checked(parsed.config_path and _path(parsed.config_path), parsed.config_name, list(parsed.overrides))


def check_export(args: list[str]) -> None:
    """``export NAME=VALUE``: only the variables the docs mean (Ray's token authentication)."""
    assert len(args) == 1 and "=" in args[0], "export NAME=VALUE"
    name, value = args[0].split("=", 1)
    assert (name, value) in (("RAY_AUTH_MODE", "token"),), f"export {name}: not a variable the docs set"


EGPO_MODULES = {
    "egpo.main": check_main,
    "egpo.generate": lambda args: check_recipe_command("egpo.generate", args),
    "egpo.rehearse": lambda args: check_recipe_command("egpo.rehearse", args),
    "egpo.analyze": lambda args: check_argparse("egpo.analyze", args),
    "egpo.preflight": check_preflight,
    "egpo.ablation": check_ablation,
    "egpo.report": lambda args: check_argparse("egpo.report", args),
    "egpo.data": lambda args: check_argparse("egpo.data", args),
    "egpo.demo.build": lambda args: check_argparse("egpo.demo.build", args),
    "egpo.ablation.attempt": lambda args: None if len(args) == 1 else _fail("python -m egpo.ablation.attempt DIR"),
}


def _fail(message: str) -> None:
    raise AssertionError(message)


def check_pytest(args: list[str]) -> None:
    paths = [a for a in args if not a.startswith("-")]
    for path in paths:
        assert list(ROOT.glob(path)), f"no test file {path}"


def pyproject_extras() -> set[str]:
    import tomllib

    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def check_pip(args: list[str]) -> None:
    assert args[:1] == ["install"], "only `pip install` is documented"
    tokens = iter(args[1:])
    for token in tokens:
        if token in ("-e", "--editable"):
            target = next(tokens)
            match = re.fullmatch(r"\.(?:\[([a-z0-9_,-]+)\])?", target)
            assert match, f"-e {target}: egpo is installed from its own folder, '.[extras]'"
            unknown = set((match.group(1) or "").split(",")) - pyproject_extras() - {""}
            assert not unknown, f"pyproject.toml has no extra {sorted(unknown)}"
        elif token in ("-r", "--requirement"):
            requirements = next(tokens)
            assert (ROOT / requirements).is_file(), f"no requirements file {requirements}"
        elif token in ("--target", "-t", "--index-url", "--extra-index-url"):
            next(tokens)
        elif token.startswith("-"):
            assert token in ("-q", "--quiet", "--no-deps", "--upgrade", "-U", "--no-build-isolation"), \
                f"pip option {token}"
        else:
            assert re.fullmatch(r"[A-Za-z0-9_.\-]+(\[[a-z0-9_,]+\])?(==[A-Za-z0-9_.+]+)?", token), \
                f"{token}: not a package name (name or name==version)"


@lru_cache(maxsize=None)
def ray_help(*subcommand: str) -> str:
    ray = Path(sys.executable).with_name("ray")
    done = subprocess.run([str(ray), *subcommand, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def check_ray(args: list[str]) -> None:
    subcommand = args[:2] if args[:1] == ["job"] else args[:1]
    text = ray_help(*subcommand)
    for token in args[len(subcommand):]:
        if token.startswith("-"):
            flag = token.split("=", 1)[0]
            assert re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", text, re.M), \
                f"`ray {' '.join(subcommand)}` has no option {flag}"


def check_python(args: list[str]) -> None:
    if args[:1] == ["-m"]:
        module, rest = args[1], args[2:]
        if module in EGPO_MODULES:
            EGPO_MODULES[module](rest)
        elif module == "pytest":
            check_pytest(rest)
        elif module == "pip":
            check_pip(rest)
        elif module == "venv":
            assert len(rest) == 1, "python -m venv DIR"
        else:
            raise AssertionError(f"python -m {module}: not a command the docs check knows")
    else:
        assert args and args[0].endswith(".py") and (ROOT / args[0]).is_file(), f"no script {args[:1]}"


def check_command(command: Command) -> None:
    program, args = command.argv[0], command.argv[1:]
    name = Path(program).name
    if name in ("python", "python3"):
        check_python(args)
    elif name == "pip":
        check_pip(args)
    elif program == ".":
        assert args and args[0].endswith("/bin/activate"), "`. DIR/bin/activate`"
    elif program == "cd":
        assert len(args) == 1
    elif program == "ray":
        check_ray(args)
    elif program == "export":
        check_export(args)
    else:
        raise AssertionError(f"{program}: not a command the docs check knows (teach tests/doc_commands.py)")


def check_inline(command: Command) -> None:
    """An inline ``python -m egpo.X ...``: the module exists and takes every option named (its arguments may be
    elided with ``...``)."""
    module = command.argv[2]
    flags = [a.split("=", 1)[0] for a in command.argv[3:] if a.startswith("-")]
    if module == "egpo.main":
        unknown = [f for f in flags if f not in HYDRA_FLAGS]
        assert not unknown, f"egpo.main has no option {unknown}"
        return
    assert module in EGPO_MODULES, f"python -m {module}: not one of egpo's commands ({', '.join(EGPO_MODULES)})"
    parser = command_parser(module)
    known = set(parser._option_string_actions) | {"--status"} if parser is not None else set()
    unknown = [f for f in flags if f not in known]
    assert not unknown, f"python -m {module} has no option {unknown}"


@lru_cache(maxsize=None)
def reference_configs() -> tuple:
    """The configs a doc's keys are looked up in: egpo's own (FSDP and Megatron) and every recipe."""
    from egpo.preflight.compose import compose

    recipes = [p.stem for p in (ROOT / "recipes").glob("*.yaml")]
    return (compose(None, "egpo_trainer", []), compose(None, "egpo_megatron_trainer", []),
            *(compose(str(ROOT / "recipes"), name, []) for name in recipes))


def key_exists(key: str) -> bool:
    from omegaconf import OmegaConf

    missing = object()
    return any(OmegaConf.select(c, key, default=missing, throw_on_missing=False) is not missing
               for c in reference_configs())


def name_exists(dotted: str) -> bool:
    """An ``egpo.*`` module, or a name defined at the top of one (read from its source: nothing is imported)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if not source.is_file():
            continue
        rest = parts[cut:]
        if not rest:
            return True
        tree = ast.parse(source.read_text())
        for node in tree.body:
            names = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
                if node.name == rest[0] and len(rest) == 2 and isinstance(node, ast.ClassDef):
                    return any(getattr(n, "name", None) == rest[1] for n in node.body)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [(a.asname or a.name).split(".")[0] for a in node.names]
            if rest[0] in names and len(rest) == 1:
                return True
        return False
    return False
