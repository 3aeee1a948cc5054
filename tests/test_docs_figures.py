"""The figures docs/cpu.md quotes from README's CPU main job, against the run: the page's three `[egpo]` lines are
what the first three steps of the README command print (seeded: the same on every machine with these versions).
A change that moves them fails here until the page is measured again. Run on verl 0.9.1, the stack the page names."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import VERL

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cpu.md"
LINE = re.compile(r"\[egpo\] step (\d+): (.*)$", re.M)  # after Ray's "(Process pid=N)" prefix

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(VERL != "0.9.1", reason="docs/cpu.md quotes the verl 0.9.1 run")]


def quoted_lines() -> dict[int, str]:
    text = PAGE.read_text()
    block = text[text.index("<!-- figures: the README run's first three steps"):]
    block = block[block.index("```text") + len("```text"):]
    block = block[:block.index("```")]
    return {int(step): figures for step, figures in LINE.findall(block)}


def test_the_readme_runs_first_three_steps_print_what_docs_cpu_md_quotes(tmp_path):
    quoted = quoted_lines()
    assert sorted(quoted) == [1, 2, 3]
    command = [sys.executable, "-m", "egpo.main", f"--config-path={ROOT / 'recipes'}", "--config-name=cpu_warm",
               "algorithm.entropy_source=rollout",  # README's command, to its third step, its outputs in tmp_path
               "trainer.total_training_steps=3", f"trainer.default_local_dir={tmp_path / 'run'}"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    printed = {int(step): figures for step, figures in LINE.findall(proc.stdout)}
    for step, figures in quoted.items():
        ran = dict(part.split("=") for part in printed[step].split())
        for part in figures.split():
            name, value = part.split("=")
            if name == "rollout_vs_actor":  # fp32 rounding between two programs: the page gives its order
                assert float(ran[name]) < 10 * float(value), (step, name, ran[name])
            else:
                assert ran[name] == value, f"step {step}: {name}={ran[name]}, docs/cpu.md says {value}"
    summary = proc.stdout[proc.stdout.index("[egpo] done:"):]
    assert len(proc.stdout.splitlines()) < 120, "the console no longer fits a screen or two"
    assert summary.rstrip().endswith(f"[egpo] report: python -m egpo.report {tmp_path / 'run'}")
