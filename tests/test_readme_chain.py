"""README's CPU main job and its generation chain, as a user runs them in a checkout, on verl 0.9.1 (the stack
docs/cpu.md quotes).

The commands are read from README.md (docs/generate.md's chain must be the same text) and run with bash in a
working directory that holds the checkout's ``recipes/``, each after the one above it; the main job is cut to its
first three steps (``trainer.total_training_steps=3`` appended: the recipe saves its checkpoint at the last step
whatever the count). Then:

* the figures docs/cpu.md quotes are what those three steps print (seeded: the same on every machine with these
  versions; a change that moves them fails here until the page is measured again), and the closing summary is the
  last thing the console shows;
* the chain's three commands run as written: the base model's samples (their entropy and log probabilities equal a
  float64 recompute), the checkpoint's reading of the same tokens (its weights', not the base model's), the analysis;
* README's generation command killed mid-way (SIGKILL to it and everything it started) finishes on the same command
  with each row once and the rows of the uninterrupted run.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import VERL
from egpo.process_tree import kill_tree
from generate_runs import float64_recompute, hf_model, max_abs_diff, rows

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cpu.md"
LINE = re.compile(r"\[egpo\] step (\d+): (.*)$", re.M)  # after Ray's "(Process pid=N)" prefix
MAIN_JOB = 'python -m egpo.main --config-path="$PWD/recipes" --config-name=cpu_warm'
STEPS = 3
# `python` is this environment's, as after README's `. .venv/bin/activate`
ACTIVATED = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
             "PYTHONUNBUFFERED": "1"}

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(VERL != "0.9.1", reason="docs/cpu.md quotes the verl 0.9.1 run")]


def bash_blocks(text: str) -> list[list[str]]:
    """Each ```bash block of a page as its commands (continuation lines joined, comments dropped)."""
    blocks = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        blocks.append([re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines() if line.strip()])
    return blocks


def readme_commands() -> tuple[str, list[str]]:
    """README's CPU main job and the generation chain that follows it."""
    blocks = bash_blocks((ROOT / "README.md").read_text())
    (main,) = [line[line.index(MAIN_JOB):] for block in blocks for line in block if MAIN_JOB in line]
    (chain,) = [block for block in blocks if block and block[0].startswith("python -m egpo.generate")]
    return main, chain


def quoted_columns() -> tuple[list[str], list[str]]:
    """The columns the page says are the same on every machine, and those it quotes as an order only."""
    marker = re.search(r"<!-- figures: the README run's first three steps.*?; exact: ([\w ]+); order: ([\w ]+) -->",
                       PAGE.read_text())
    return marker.group(1).split(), marker.group(2).split()


def quoted_lines() -> dict[int, str]:
    text = PAGE.read_text()
    block = text[text.index("<!-- figures: the README run's first three steps"):]
    block = block[block.index("```text") + len("```text"):]
    block = block[:block.index("```")]
    return {int(step): figures for step, figures in LINE.findall(block)}


def bash(workdir: Path, command: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """A command as a terminal runs it: bash, in the working directory, both streams in the order written."""
    return subprocess.run(["bash", "-c", command], cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, env=ACTIVATED)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A working directory as README's commands expect one: the checkout's recipes, nothing else yet."""
    workdir = tmp_path_factory.mktemp("checkout")
    (workdir / "recipes").symlink_to(ROOT / "recipes")
    return workdir


@pytest.fixture(scope="module")
def readme_run(checkout):
    main, _ = readme_commands()
    return bash(checkout, f"{main} trainer.total_training_steps={STEPS}")


@pytest.fixture(scope="module")
def readme_chain(checkout, readme_run):
    assert readme_run.returncode == 0, readme_run.stdout[-6000:]
    _, chain = readme_commands()
    done = []
    for command in chain:
        done.append(bash(checkout, command))
        assert done[-1].returncode == 0, f"{command}\n{done[-1].stdout[-6000:]}"
    return done


def test_docs_generate_md_gives_readmes_chain():
    main, chain = readme_commands()
    (page,) = [block for block in bash_blocks((ROOT / "docs" / "generate.md").read_text())
               if block and block[0].startswith("python -m egpo.main")]
    assert page == [main, *chain]


def test_the_readme_runs_first_three_steps_print_what_docs_cpu_md_quotes(readme_run, checkout):
    quoted = quoted_lines()
    assert sorted(quoted) == [1, 2, 3]
    proc = readme_run
    assert proc.returncode == 0, proc.stdout[-6000:]
    printed = {int(step): figures for step, figures in LINE.findall(proc.stdout)}
    exact, order = quoted_columns()
    page = " ".join(PAGE.read_text().split())
    assert all(f"`{name}` is not" in page for name in order)  # the prose says which column varies, and why
    for step, figures in quoted.items():
        ran = dict(part.split("=") for part in printed[step].split())
        assert sorted(name for name, _ in (part.split("=") for part in figures.split())) == sorted(exact + order)
        for part in figures.split():
            name, value = part.split("=")
            if name in order:  # fp32 rounding between two programs: the page gives its order
                assert float(ran[name]) < 10 * float(value), (step, name, ran[name])
            else:
                assert ran[name] == value, f"step {step}: {name}={ran[name]}, docs/cpu.md says {value}"
    where = checkout / "checkpoints" / "egpo" / "cpu_warm"
    summary = proc.stdout[proc.stdout.index("[egpo] done:"):]
    assert len(proc.stdout.splitlines()) < 120, "the console no longer fits a screen or two"
    # the closing summary is the last thing the run prints, after verl's progress bar ended
    assert summary.rstrip().splitlines() == summary.rstrip().splitlines()[:3], summary
    assert summary.rstrip().endswith(f"[egpo] report: python -m egpo.report {where}"), summary
    assert "Training Progress: 100%" in proc.stdout[:proc.stdout.index("[egpo] done:")]
    assert sorted(p.name for p in where.glob("global_step_*")) == [f"global_step_{STEPS}"]  # what the chain reads
    # Hydra's own files are the run's, in its directory; none in the checkout
    assert (where / "hydra" / ".hydra" / "overrides.yaml").exists() and not (checkout / "outputs").exists()
    assert "ray init kwargs" not in proc.stdout and "ray init kwargs: " in (where / "log.txt").read_text()


def checkpoint_weights(checkout: Path) -> dict:
    state = torch.load(checkout / "checkpoints" / "egpo" / "cpu_warm" / f"global_step_{STEPS}" / "actor" /
                       "model_world_size_1_rank_0.pt", weights_only=False)
    return {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}


def test_readmes_generation_chain_runs_as_written_after_its_run(readme_chain, checkout):
    sampled, scored, analysed = readme_chain
    base, on_base = checkout / "gen" / "base", checkout / "gen" / "trained_on_base"
    frame, again = rows(base), rows(on_base)
    assert len(frame) == 8 * 8 and frame.score.notna().all()  # the 8 validation problems, 8 samples each, scored
    model = checkout / ".egpo_demo_warm" / "model"
    entropy, log_prob = float64_recompute(hf_model(model), frame)
    assert max_abs_diff(frame.entropy, entropy) <= 1e-4 and max_abs_diff(frame.log_prob, log_prob) <= 1e-4

    # the checkpoint teacher-forced over the same tokens (verl 0.9.1's recompute), with its weights, not the base's
    assert "no rollout servers started" in scored.stdout, scored.stdout[-3000:]
    assert [list(r) for r in again.response_ids] == [list(r) for r in frame.response_ids]
    trained, _ = float64_recompute(hf_model(model, checkpoint_weights(checkout)), again)
    assert max_abs_diff(again.entropy, trained) <= 1e-4
    assert max_abs_diff(again.entropy, frame.entropy) > 1e-3

    assert (checkout / "gen" / "analysis" / "index.html").stat().st_size > 1000
    assert (checkout / "gen" / "analysis" / "analysis.json").exists(), analysed.stdout[-3000:]


def test_a_generation_ends_with_its_closing_line_and_names_only_files_it_wrote(readme_chain, checkout):
    """The closing line comes after every worker's last line (both streams, as a terminal shows them); the file a
    generation's configuration line names exists; a run that trains nothing prints none of verl's training-schedule
    lines."""
    sampled, scored, _ = readme_chain
    for proc, out in ((sampled, checkout / "gen" / "base"), (scored, checkout / "gen" / "trained_on_base")):
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        assert lines[-1].startswith(f"[egpo] generate: 64 rows in {out / 'samples'}; the analysis:"), lines[-5:]
        for noise in ("Total training steps", "num_warmup_steps", "Checkpoint tracker file does not exist"):
            assert noise not in proc.stdout, noise
        named = [line.split("[egpo] the run's configuration: ", 1)[1].split(" (")[0] for line in lines
                 if "[egpo] the run's configuration: " in line]
        assert named == [str(out / "run.json")] and Path(named[0]).is_file()


def test_a_killed_generation_finishes_to_the_uninterrupted_rows(readme_chain, checkout):
    _, chain = readme_commands()
    cut = checkout / "gen" / "cut"
    command = chain[0].replace("--out gen/base", "--out gen/cut")
    assert command != chain[0]
    proc = subprocess.Popen(["bash", "-c", command], cwd=checkout, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=ACTIVATED)
    try:
        end = time.time() + 900
        while not (cut / "samples" / "part-00000.parquet").exists():
            assert proc.poll() is None and time.time() < end, "the run ended before its first part"
            time.sleep(0.1)
        kill_tree(proc.pid)  # the run and every process it started, mid-way (Ray's workers too)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
    written = sorted(p.name for p in (cut / "samples").glob("part-*.parquet"))
    assert not (cut / "done.json").exists() and written == ["part-00000.parquet"], written
    finished = bash(checkout, command)
    assert finished.returncode == 0, finished.stdout[-3000:]

    ours, theirs = rows(cut), rows(checkout / "gen" / "base")
    assert ours[["index", "sample"]].values.tolist() == theirs[["index", "sample"]].values.tolist()  # each row once
    assert [list(r) for r in ours.response_ids] == [list(r) for r in theirs.response_ids]
    assert max_abs_diff(ours.entropy, theirs.entropy) == 0.0
