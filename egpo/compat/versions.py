"""The verl versions egpo is tested with; any other stops start-up naming them."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from egpo.errors import IncompatibleDependencyError

TESTED_VERL = ("0.7.1", "0.9.1")
INSTALL = {"0.7.1": "pip install -e '.[verl071]'", "0.9.1": "pip install -e '.[verl091]'"}


class UnsupportedVerlError(IncompatibleDependencyError):
    pass


def verl_version() -> str:
    """The installed verl's version, checked against :data:`TESTED_VERL`."""
    try:
        found = version("verl")
    except PackageNotFoundError:
        found = None
    if found not in TESTED_VERL:
        raise UnsupportedVerlError(
            f"egpo is tested with verl {' and '.join(TESTED_VERL)}; this environment has verl {found}. Install one of "
            f"them: {INSTALL['0.9.1']} (verl 0.9.1, transformers 5.x, numpy 2) or {INSTALL['0.7.1']} (verl 0.7.1, "
            "transformers 4.57.1) (README, 'Install')"
        )
    return found
