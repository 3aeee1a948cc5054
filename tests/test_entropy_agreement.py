"""The rollout-vs-actor agreement (egpo.trainer.metrics.entropy_agreement) against numpy in float64: only valid
response tokens where both entropies are finite count; Pearson's r as numpy's corrcoef gives it."""

import numpy as np
import pytest
import torch

from egpo.trainer.metrics import PREFIX, SURPRISAL_PREFIX, entropy_agreement


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
    assert metrics[f"{PREFIX}mean_diff"] == pytest.approx((r - a).mean(), rel=1e-12)
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


def test_surprisal_is_the_entropys_one_sample_estimate():
    """Tokens drawn from known distributions (float64): the mean surprisal -log p(y) of the drawn tokens is the mean
    entropy to within sampling error (mean_diff within 4 standard errors of 0), while each token's surprisal is far
    from its entropy (mean_abs_diff well above 0) and correlates with it only partly."""
    g = torch.Generator().manual_seed(0)
    rows, cols, vocab = 64, 256, 50
    logits = torch.randn(rows, cols, vocab, generator=g, dtype=torch.float64) * torch.rand(rows, cols, 1, generator=g,
                                                                                          dtype=torch.float64) * 4
    log_p = torch.log_softmax(logits, -1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    tokens = torch.multinomial(log_p.exp().reshape(-1, vocab), 1, generator=g).reshape(rows, cols)
    surprisal = -log_p.gather(-1, tokens[..., None]).squeeze(-1)
    metrics = entropy_agreement(surprisal, entropy, torch.ones(rows, cols), SURPRISAL_PREFIX)
    error = (surprisal - entropy).std() / (rows * cols) ** 0.5
    assert abs(metrics[f"{SURPRISAL_PREFIX}mean_diff"]) < 4 * float(error)
    assert metrics[f"{SURPRISAL_PREFIX}mean_abs_diff"] > 0.3
    assert 0.2 < metrics[f"{SURPRISAL_PREFIX}pearson"] < 0.9
    # log probs of another distribution than the one sampled (greedy tokens): the bias is no longer within the error
    greedy = -log_p.max(-1).values
    off = entropy_agreement(greedy, entropy, torch.ones(rows, cols), SURPRISAL_PREFIX)
    assert off[f"{SURPRISAL_PREFIX}mean_diff"] < -40 * float(error)
