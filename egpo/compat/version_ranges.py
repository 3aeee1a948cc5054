"""Engine versions as tested ranges: a version between two tested ones of a range runs if every patch target has the
shape of a bracketing tested version's table; anything outside the ranges is refused by name.

A range is ``(low, high)``, both tested (CI runs both ends on real classes). For a version inside it that is not
itself tested, the candidates are the nearest tested version below and the nearest above, in that order: the
engine's own shape check picks the first whose every target matches.
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version


def _v(version: str) -> Version | None:
    try:
        return Version(version)
    except (InvalidVersion, TypeError):
        return None


def candidates(version: str | None, tested, ranges) -> tuple[str, ...]:
    """The tested versions whose tables may fit ``version``: itself if tested, its bracket inside a range, else ()."""
    if version in tested:
        return (version,)
    found = _v(version) if version else None
    if found is None:
        return ()
    for low, high in ranges:
        if _v(low) < found < _v(high):
            inside = sorted((t for t in tested if _v(low) <= _v(t) <= _v(high)), key=_v)
            below = max((t for t in inside if _v(t) < found), key=_v)
            above = min((t for t in inside if _v(t) > found), key=_v)
            return (below, above)
    return ()


def describe(ranges) -> str:
    """``0.12.0; 0.24.0 to 0.33.0``."""
    return "; ".join(low if low == high else f"{low} to {high}" for low, high in ranges)


def bracket_note(engine: str, version: str, tested, ranges) -> str | None:
    """The line said once at start-up for a version inside a range that is not itself tested (None otherwise)."""
    found = candidates(version, tested, ranges)
    if len(found) != 2:
        return None
    return (f"{engine} {version} is not itself tested: it lies inside egpo's tested range, between {engine} {found[0]} "
            f"and {found[1]}, and runs if every patch target has the shape one of their tables expects (checked before "
            "the engine starts)")
