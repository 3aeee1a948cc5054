"""What a start-up check reports: facts (the run's numbers), warnings (hours likely wasted) and errors (the run
would die or train something else than asked). Every warning and error names its fix.

Every check of :mod:`egpo.preflight` returns its findings (all of its problems, never only the first); the one pass
(:func:`egpo.preflight.prepare.prepare`) collects them, and :func:`refusal` turns the errors among them into the one
exception ``python -m egpo.main`` refuses the run with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from egpo.errors import EgpoConfigError, EgpoError

LEVELS = ("fact", "warning", "error")
TAGS = {"fact": "  ", "warning": "! ", "error": "X "}  # each printed line's first two characters


@dataclass(frozen=True)
class Finding:
    level: str
    topic: str
    text: str
    # an error's alternative fixes, each a tuple of Hydra overrides that together make the config pass
    fixes: tuple[tuple[str, ...], ...] = ()
    # an error raised below the check (an engine's own limits, an incompatible dependency), kept as it was raised
    cause: EgpoError | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"finding level {self.level!r} is not one of {LEVELS}")

    def line(self) -> str:
        return f"{TAGS[self.level]}{self.topic:<10} {self.text}"


def fact(topic: str, text: str) -> Finding:
    return Finding("fact", topic, text)


def warning(topic: str, text: str) -> Finding:
    return Finding("warning", topic, text)


def error(topic: str, text: str, fixes: tuple[tuple[str, ...], ...] = ()) -> Finding:
    return Finding("error", topic, text, fixes)


def refused(topic: str, err: EgpoError) -> Finding:
    """The error finding of a refusal raised below a check (its fixes and its kind kept)."""
    return Finding("error", topic, str(err), getattr(err, "fixes", ()), err)


def refusal(findings: list[Finding]) -> EgpoError | None:
    """The exception that refuses a run with these findings' errors (None: no error): the one refusal as it was
    raised, or all of them, one line each."""
    errors = [f for f in findings if f.level == "error"]
    if not errors:
        return None
    if len(errors) == 1:
        return errors[0].cause or EgpoConfigError(errors[0].text, errors[0].fixes)
    return EgpoConfigError(f"{len(errors)} problems:\n" + "\n".join(f.line() for f in errors))


def refuse(findings: list[Finding]) -> list[Finding]:
    """Raises :func:`refusal` where there is an error; returns the findings otherwise."""
    err = refusal(findings)
    if err is not None:
        raise err
    return findings
