"""The EGPO advantage: pure tensor math (plus verl's own GRPO function)."""

from egpo.advantage.cot import compute_cot_mask, prompt_ends_inside_think
from egpo.advantage.egpo import (
    EgpoDiagnostics,
    compute_egpo_advantage_with_diagnostics,
    compute_egpo_outcome_advantage,
    validate_egpo_coefficients,
)

__all__ = [
    "EgpoDiagnostics",
    "compute_cot_mask",
    "compute_egpo_advantage_with_diagnostics",
    "compute_egpo_outcome_advantage",
    "prompt_ends_inside_think",
    "validate_egpo_coefficients",
]
