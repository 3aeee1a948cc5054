"""The EGPO advantage: pure tensor math (plus verl's own GRPO function)."""

from egpo.advantage.cot import compute_cot_mask, prompt_ends_inside_think
from egpo.advantage.egpo import (
    GRANULARITIES,
    SPANS,
    EgpoDiagnostics,
    compute_egpo_advantage,
    validate_egpo_coefficients,
    validate_egpo_variant,
)

__all__ = [
    "GRANULARITIES",
    "SPANS",
    "EgpoDiagnostics",
    "compute_cot_mask",
    "compute_egpo_advantage",
    "prompt_ends_inside_think",
    "validate_egpo_coefficients",
    "validate_egpo_variant",
]
