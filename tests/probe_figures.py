"""What the probe must report alike when the same update runs in other micro-batches (fixed rows vs a token
budget): shared by the probe's tests around verl 0.7.1's actor and verl 0.9.1's engine."""

import math

import pytest

# the same batch in other micro-batches: fp32 rounding only. The prediction goes through the AdamW step; the
# attribution also through the first step's preconditioner 1/(|g| + eps), which magnifies rounding where g ~ 0
SPLIT_TOLERANCE = {"probe/entropy_before": 1e-6, "probe/delta_h_pred": 1e-3, "probe/delta_h_pred_fresh": 1e-3,
                   "probe/attr_same_prompt": 1e-2, "probe/attr_cross_prompt": 1e-2, "probe/attr_total": 1e-2,
                   "probe/pred_cross_fit": 1e-2}


def assert_same_figures_across_splits(fixed: dict, dynamic: dict) -> None:
    for key, rel in SPLIT_TOLERANCE.items():
        assert math.isfinite(dynamic[key])
        assert dynamic[key] == pytest.approx(fixed[key], rel=rel), key
    # measured through fp32 weights whose update summed its micro-batches in another order: ~1e-8 of ~1e-6
    assert dynamic["probe/delta_h_realised"] == pytest.approx(fixed["probe/delta_h_realised"], rel=5e-2)
