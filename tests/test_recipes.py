"""Every recipe composes through egpo.main and passes egpo's start-up checks."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from egpo.settings import EgpoSettings

RECIPES = Path(__file__).resolve().parent.parent / "recipes"


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("*.yaml")))
def test_recipe_composes(recipe):
    proc = subprocess.run(
        [sys.executable, "-m", "egpo.main", f"--config-path={RECIPES}", f"--config-name={recipe}", "--cfg", "job"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    cfg = yaml.safe_load(proc.stdout)
    assert cfg["algorithm"]["adv_estimator"] == "egpo"
    assert "actor_rollout_ref" in cfg and "rollout_correction" in cfg["algorithm"]
    from omegaconf import OmegaConf

    EgpoSettings.from_algorithm(OmegaConf.create(cfg["algorithm"]))
