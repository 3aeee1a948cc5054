"""verl 0.9.1's GPU line for sglang (README, 'GPU'; the preflight's fix for a recipe whose engine is missing):
``pip install --no-deps sglang==0.5.12 && pip install -r requirements/sglang-0.5.12-gpu.txt``, because
``verl[sglang]==0.9.1`` does not resolve (sglang pins transformers 5.6.0, which verl 0.9.1 excludes). The file must be
sglang 0.5.12's own dependencies, its metadata's, without that one pin: checked where sglang 0.5.12 is installed
(verl 0.9.1's sglang lane)."""

from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from sglang_required import require_sglang

from egpo.rollout.sglang.versions import installed_sglang

require_sglang()  # skips where sglang is not installed; the lane that installs it runs this module
if installed_sglang() != "0.5.12":
    pytest.skip(f"sglang 0.5.12 is not installed here ({installed_sglang()}): verl 0.9.1's sglang lane checks the "
                "file against its metadata", allow_module_level=True)

FILE = Path(__file__).resolve().parent.parent / "requirements" / "sglang-0.5.12-gpu.txt"


def test_the_file_is_sglangs_own_dependencies_without_its_transformers_pin():
    declared = [r for r in metadata.requires("sglang") if "extra ==" not in r]
    listed = [line.strip() for line in FILE.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert "transformers==5.6.0" in {str(Requirement(r)) for r in declared}  # the pin verl 0.9.1 excludes
    assert {str(Requirement(r)) for r in listed} == {str(Requirement(r)) for r in declared
                                                     if Requirement(r).name.lower() != "transformers"}


def test_the_preflights_fix_names_the_file():
    from egpo.compat.versions import VERL

    assert VERL["0.9.1"].gpu_engine_install["sglang"] == (f"pip install --no-deps sglang==0.5.12 && pip install -r "
                                                          f"requirements/{FILE.name}")
