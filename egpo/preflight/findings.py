"""What a preflight check reports: facts (the run's numbers), warnings (hours likely wasted) and errors (the run
would die or train something else than asked). Every warning and error names its fix."""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = ("fact", "warning", "error")
TAGS = {"fact": "  ", "warning": "! ", "error": "X "}  # each printed line's first two characters


@dataclass(frozen=True)
class Finding:
    level: str
    topic: str
    text: str

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"finding level {self.level!r} is not one of {LEVELS}")

    def line(self) -> str:
        return f"{TAGS[self.level]}{self.topic:<10} {self.text}"


def fact(topic: str, text: str) -> Finding:
    return Finding("fact", topic, text)


def warning(topic: str, text: str) -> Finding:
    return Finding("warning", topic, text)


def error(topic: str, text: str) -> Finding:
    return Finding("error", topic, text)
