"""Every command README.md and docs/ show is one that works as written: each shell command composed or parsed with
its own arguments (a renamed flag, arm, recipe, extra or requirements file fails here), each inline
``python -m egpo...`` takes the options it names, every config key the docs name exists in egpo's configs or
recipes, and every ``egpo.*`` name exists. Nothing long runs: no training, no install (tests/doc_commands.py)."""

from pathlib import Path

import pytest

from conftest import VERL

from doc_commands import (DOCS, ROOT, Command, check_command, check_inline, config_keys, inline_commands, key_exists,
                          name_exists, python_names, shell_commands)

COMMANDS = [c for doc in DOCS for c in shell_commands(doc)]
INLINE = [c for doc in DOCS for c in inline_commands(doc)]
KEYS = [(doc.relative_to(ROOT), line, key) for doc in DOCS for line, key in config_keys(doc)]
NAMES = [(doc.relative_to(ROOT), line, name) for doc in DOCS for line, name in python_names(doc)]
# keys egpo.main sets at start-up (not in any config file), with where
SET_AT_START_UP = {"actor_rollout_ref.rollout.agent.agent_loop_manager_class": "egpo.preflight.rollout_path"}
# keys of one verl only (the docs say so where they name them), checked on that verl's stack
ONE_VERL_ONLY = {"trainer.use_legacy_worker_impl": "0.7.1"}


def test_the_docs_show_commands_to_check():
    programs = {Path(c.argv[0]).name for c in COMMANDS}
    assert {"python", "pip", "ray"} <= programs and len(COMMANDS) > 40 and len(KEYS) > 30, (programs, len(COMMANDS))
    assert any(c.argv[1:3] == ["-m", "egpo.ablation"] and "--ray-address" in c.argv for c in COMMANDS)


def checked(check, command: Command) -> None:
    """``check(command)``, its failure naming the doc, the line and the command."""
    try:
        check(command)
    except AssertionError as err:
        raise AssertionError(f"{command.where()}\n{err}") from None


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.doc}:{c.line}:{c.argv[0]}")
def test_every_shell_command_in_the_docs_works_as_written(command):
    checked(check_command, command)


@pytest.mark.parametrize("command", INLINE, ids=lambda c: f"{c.doc}:{c.line}")
def test_every_inline_egpo_command_takes_the_options_it_names(command):
    checked(check_inline, command)


def test_every_config_key_the_docs_name_exists():
    missing = [f"{doc}:{line}: {key}" for doc, line, key in KEYS
               if key not in SET_AT_START_UP and ONE_VERL_ONLY.get(key, VERL) == VERL and not key_exists(key)]
    assert not missing, "keys the docs name that no config of egpo's has:\n" + "\n".join(missing)


def test_every_egpo_name_the_docs_name_exists():
    missing = [f"{doc}:{line}: {name}" for doc, line, name in NAMES if not name_exists(name)]
    assert not missing, "names the docs give that egpo does not define:\n" + "\n".join(missing)


def test_the_checks_read_the_markdown_as_a_shell_does_and_catch_a_renamed_flag(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("text\n\n```bash\nEGPO_X=1 python -m egpo.ablation --config-path=\"$PWD/recipes\" \\\n"
                   "    --config-name=cpu_smoke --out a --arms grpo   # a comment && not a command\n"
                   "python3 -m venv .v && . .v/bin/activate && pip install -e '.[test]'\n```\n"
                   "`python -m egpo.report DIR --window 3`, `algorithm.egpo_lambda=0.4`, `++ray_kwargs.ray_init.x=1`\n")
    import doc_commands

    doc_commands.ROOT, root = tmp_path, doc_commands.ROOT
    try:
        found = shell_commands(doc)
        inline = inline_commands(doc)
        keys = config_keys(doc)
    finally:
        doc_commands.ROOT = root
    assert [(c.line, c.argv[:3], c.env) for c in found] == [
        (4, ["python", "-m", "egpo.ablation"], {"EGPO_X": "1"}), (6, ["python3", "-m", "venv"], {}),
        (6, [".", ".v/bin/activate"], {}), (6, ["pip", "install", "-e"], {})]
    assert found[0].argv[-2:] == ["--arms", "grpo"]  # the comment, and the && inside it, are not read
    assert [c.argv for c in inline] == [["python", "-m", "egpo.report", "DIR", "--window", "3"]]
    assert keys == [(8, "algorithm.egpo_lambda")]  # the ++ key is one a run adds
    for command in (*found, *inline):
        check_inline(command) if command in inline else check_command(command)
    renamed = Command("page.md", 4, [*found[0].argv[:-2], "--arm", "grpo"])
    with pytest.raises(AssertionError, match="refuses these arguments"):
        check_command(renamed)
    with pytest.raises(AssertionError, match="no option"):
        check_inline(Command("page.md", 8, ["python", "-m", "egpo.report", "DIR", "--windows", "3"]))
    with pytest.raises(AssertionError, match="no extra"):
        check_command(Command("page.md", 6, ["pip", "install", "-e", ".[verl092]"]))
    with pytest.raises(Exception, match="cpu_smok"):
        check_command(Command("page.md", 4, ["python", "-m", "egpo.main", f"--config-path={root}/recipes",
                                             "--config-name=cpu_smok"]))
    assert not key_exists("algorithm.egpo_lamda") and key_exists("algorithm.egpo_lambda")
    assert name_exists("egpo.ablation.cluster.JobDispatch") and not name_exists("egpo.ablation.cluster.JobDispatcher")


def test_every_ci_lane_that_runs_tests_prints_the_versions_its_environment_resolved():
    """Several of a lane's packages arrive unpinned (ray, pyarrow): each lane running pytest first prints what its
    own environment resolved, so a red CI names the drift."""
    import re
    import subprocess
    import sys

    script = (Path(__file__).resolve().parent.parent / ".ci" / "run").read_text()
    # a lane's command runs in one place, run_in, which prints what the lane's environment resolved first; pytest
    # runs through it (run_lane) and so does README's own test command
    runner = re.search(r"^run_in\(\) \{.*?^\}", script, flags=re.M | re.S).group(0)
    assert runner.index('resolved "$env"') < runner.index('"$@"')
    lanes = re.findall(r'(?:run_lane|lane_or_note) \\?\s*"[^"]+" (\.venv[\w.\-]*)', script)
    assert len(lanes) >= 10, lanes
    for env in lanes:  # every lane's environment is one CI builds (.venv: README's install lines make it)
        assert env == ".venv" or re.search(rf"(new_stack|layer \S+|layer_over \S+|python3 -m venv) {re.escape(env)}\b",
                                           script), env
    lane_runs = [line for line in script.splitlines()
                 if "python -m pytest" in line and not line.lstrip().startswith("#")]
    assert len(lane_runs) == 2 and all("run_in" in line or "--collect-only" in line for line in lane_runs), lane_runs
    function = re.search(r"^resolved\(\) \{.*?^\}", script, flags=re.M | re.S).group(0)
    prefix = str(Path(sys.executable).parent.parent)
    out = subprocess.run(["bash", "-c", f"{function}\nresolved {prefix}"], capture_output=True, text=True,
                         timeout=120).stdout
    from importlib.metadata import version

    for name in ("torch", "transformers", "ray", "pyarrow", "tensordict"):
        assert f"{name} {version(name)}" in out, out


def test_ci_runs_readmes_install_and_test_commands_as_readme_writes_them():
    """.ci/run reads README's install lines and test command out of README.md (.ci/readme_commands.py) and runs them
    as written in a fresh .venv that nothing else installs into; the sglang lane takes every test module that needs
    sglang, and each environment with verl collects the suite."""
    import re
    import subprocess
    import sys

    readme = (ROOT / "README.md").read_text()

    def printed(what):
        return subprocess.run([sys.executable, str(ROOT / ".ci" / "readme_commands.py"), what], capture_output=True,
                              text=True, check=True, timeout=60).stdout.strip()

    install, test = printed("install"), printed("test")
    assert install == ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
                       "pip install -e '.[verl091,test]'")
    assert install in readme.replace("&& \\\n", "&& ") and f"```bash\n{test}\n```" in readme
    assert test == "python -m pytest -q"
    script = (ROOT / ".ci" / "run").read_text()
    assert 'readme_install=$(python3 .ci/readme_commands.py install)' in script
    assert 'readme_test=$(python3 .ci/readme_commands.py test)' in script
    assert 'bash -euc "$readme_install"' in script
    # README's test command runs as a command of its own through run_in, never as pytest's arguments
    assert re.search(r'^command_lane_or_note "[^"]+" \.venv \\\n\s+bash -c "\$readme_test"$', script, re.M)
    assert re.search(r"^command_lane_or_note\(\) \{[^\n]*\n\s+run_in ", script, re.M)
    # nothing but README's lines installs into .venv: every other environment is a layer over it or its own
    assert not re.search(r"\.venv/bin/(python -m )?pip\b|(new_stack|-m venv) \.venv(?=\s)", script)
    assert "collects .venv" in script
    # the sglang lane's files: every module that asks for sglang through tests/sglang_required.py, found by the grep
    # .ci/run runs; a module that asks for it another way would run nowhere with sglang
    grep = re.search(r'SGLANG_091=\(\$\(grep -l "([^"]+)" tests/test_\*\.py\)\)', script).group(1)
    tests = ROOT / "tests"
    asking = {p.name for p in tests.glob("test_*.py")
              if re.search(r"\brequire_sglang\(|\bimport_sglang_sampler\(", p.read_text())}
    found = {p.name for p in tests.glob("test_*.py") if grep in p.read_text()}
    assert asking and asking == found, (asking, found)
