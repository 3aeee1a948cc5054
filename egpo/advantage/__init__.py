"""The EGPO advantage: pure tensor math (plus verl's own GRPO function).

The names below load on first use: the start-up checks read :mod:`egpo.advantage.config` and
:mod:`egpo.advantage.variants` without importing verl, which :mod:`egpo.advantage.egpo` imports for its GRPO part.
"""

from importlib import import_module

_HOME = {
    "GRANULARITIES": "egpo.advantage.variants",
    "SPANS": "egpo.advantage.variants",
    "validate_egpo_coefficients": "egpo.advantage.variants",
    "validate_egpo_variant": "egpo.advantage.variants",
    "compute_cot_mask": "egpo.advantage.cot",
    "prompt_ends_inside_think": "egpo.advantage.cot",
    "EgpoDiagnostics": "egpo.advantage.egpo",
    "compute_egpo_advantage": "egpo.advantage.egpo",
    "compose_method": "egpo.advantage.method",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'egpo.advantage' has no attribute {name!r}")
    return getattr(import_module(_HOME[name]), name)
