"""The rollout-vs-actor agreement (egpo.trainer.metrics.entropy_agreement) against numpy in float64: only valid
response tokens where both entropies are finite count; Pearson's r as numpy's corrcoef gives it."""

import numpy as np
import pytest
import torch

from egpo.trainer.metrics import PREFIX, entropy_agreement


@pytest.mark.parametrize("seed", range(4))
def test_agreement_is_numpys_over_the_valid_finite_tokens(seed):
    g = torch.Generator().manual_seed(seed)
    rollout = torch.rand(6, 40, generator=g) * 3
    actor = rollout + torch.randn(6, 40, generator=g) * 0.1
    mask = (torch.arange(40)[None] < torch.randint(5, 41, (6, 1), generator=g)).float()
    rollout[1, 2], actor[2, 3], rollout[3, 39] = float("nan"), float("inf"), float("nan")
    before = (rollout.clone(), actor.clone())
    metrics = entropy_agreement(rollout, actor, mask)
    keep = (mask.numpy() > 0) & np.isfinite(rollout.numpy()) & np.isfinite(actor.numpy())
    r, a = rollout.numpy()[keep].astype(np.float64), actor.numpy()[keep].astype(np.float64)
    assert metrics[f"{PREFIX}tokens"] == keep.sum()
    assert metrics[f"{PREFIX}mean_abs_diff"] == pytest.approx(np.abs(r - a).mean(), rel=1e-12)
    assert metrics[f"{PREFIX}max_abs_diff"] == pytest.approx(np.abs(r - a).max(), rel=1e-12)
    assert metrics[f"{PREFIX}pearson"] == pytest.approx(np.corrcoef(r, a)[0, 1], rel=1e-12)
    # the caller's tensors are left as they were (the centring works on its own float64 copies)
    torch.testing.assert_close(rollout, before[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(actor, before[1], rtol=0, atol=0, equal_nan=True)


def test_no_valid_token_and_a_constant_entropy():
    assert entropy_agreement(torch.rand(2, 3), torch.rand(2, 3), torch.zeros(2, 3)) == {f"{PREFIX}tokens": 0.0}
    same = entropy_agreement(torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 3))
    assert same[f"{PREFIX}mean_abs_diff"] == 0.0 and f"{PREFIX}pearson" not in same  # r undefined at zero variance
