"""The value a misspelling meant: one shared rule for every "did you mean" egpo says (values, names, folders)."""

from __future__ import annotations

import difflib

CUTOFF = 0.6  # difflib's similarity ratio: rollot/rollout 0.92, egpo_rolout/egpo_rollout 0.96, actor/rollout 0.5


def closest(value, allowed, cutoff: float = CUTOFF) -> str | None:
    """The one of ``allowed`` within a typo of ``value``, case aside (None: none is)."""
    by_lower = {str(a).lower(): str(a) for a in allowed}
    found = difflib.get_close_matches(str(value).lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[found[0]] if found else None


def did_you_mean(value, allowed, cutoff: float = CUTOFF, show=repr) -> str:
    """`` (did you mean 'rollout'?)``, or nothing where no allowed value is within a typo of ``value``."""
    found = closest(value, allowed, cutoff)
    return f" (did you mean {show(found)}?)" if found is not None else ""
