"""The 80/20 rule's token selection (egpo.advantage.token_selection): hand-worked batches, a float64 reference,
torch.quantile's interpolated threshold, verl's own loss aggregation over the kept tokens, and the start-up refusals."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from egpo.advantage.token_selection import kept_count, top_entropy_mask, validate_token_selection
from egpo.settings import EgpoConfigError, EgpoSettings
from egpo.preflight.run_facts import with_facts


def reference_mask(entropy, mask, quantile: float) -> np.ndarray:
    """Written from the definition, in float64 numpy: sort the batch's valid entropies from the highest, keep the
    top ceil(quantile * N) by decimal arithmetic, and every valid token tied with the last one kept."""
    from decimal import Decimal

    entropy = np.asarray(entropy, dtype=np.float64)
    valid = np.asarray(mask) != 0
    values = np.sort(entropy[valid])[::-1]
    if values.size == 0:
        return np.zeros_like(valid)
    k = math.ceil(Decimal(repr(quantile)) * values.size)
    return valid & (entropy >= values[k - 1])


def test_hand_worked_batch():
    # two responses, five valid tokens; quantile 0.4 keeps ceil(2.0) = 2: the 0.9 and the 0.7
    entropy = torch.tensor([[0.9, 0.1, 0.5, 0.8], [0.3, 0.7, 0.2, 0.6]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    selection = top_entropy_mask(entropy, mask, 0.4)
    assert torch.equal(selection.mask, torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0]]))
    assert selection.mask.dtype == mask.dtype
    assert selection.threshold == pytest.approx(0.7) and selection.n_valid == 5 and selection.n_kept == 2
    assert selection.kept_entropy_mean == pytest.approx(0.8)
    metrics = selection.metrics()
    assert metrics["egpo/token_selection/kept_frac"] == pytest.approx(0.4)
    assert metrics["egpo/token_selection/entropy_threshold"] == pytest.approx(0.7)
    # 0.8 and 0.6 sit on padding: never kept, never counted


def test_ties_at_the_threshold_are_all_kept():
    entropy = torch.tensor([[0.5, 0.5, 0.5, 0.1]])
    selection = top_entropy_mask(entropy, torch.ones(1, 4, dtype=torch.long), 0.25)  # k = 1
    assert torch.equal(selection.mask, torch.tensor([[1, 1, 1, 0]]))
    assert selection.n_kept == 3 and selection.threshold == 0.5


def test_the_quantile_is_read_in_decimal():
    assert kept_count(10, 0.7) == 7  # 0.7 * 10 is 7.000000000000001 in binary floating point
    assert kept_count(10, 0.2) == 2  # Fraction(0.2) * 10 is just above 2
    assert kept_count(11, 0.2) == 3 and kept_count(1, 0.2) == 1 and kept_count(7, 1.0) == 7


@pytest.mark.parametrize("dtype", [torch.long, torch.int32, torch.float32, torch.bool])
def test_quantile_one_returns_the_mask_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(0)
    entropy = torch.rand(16, 12, generator=g)
    entropy[3, :4] = 0.0  # exact zeros among the valid tokens
    mask = (torch.rand(16, 12, generator=g) < 0.8).to(dtype)
    selection = top_entropy_mask(entropy, mask, 1.0)
    assert selection.mask.dtype == mask.dtype and torch.equal(selection.mask, mask)
    assert selection.n_kept == selection.n_valid == int(mask.bool().sum())


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 6), cols=st.integers(1, 9), seed=st.integers(0, 2**31 - 1),
    quantile=st.sampled_from([0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 0.8, 0.95, 1.0]),
    levels=st.sampled_from([0, 3]),  # 0: continuous entropies; 3: three values, many ties
)
def test_matches_the_float64_reference(rows, cols, seed, quantile, levels):
    g = torch.Generator().manual_seed(seed)
    entropy = torch.rand(rows, cols, generator=g)
    if levels:
        entropy = torch.floor(entropy * levels) / levels
    mask = (torch.rand(rows, cols, generator=g) < 0.7).long()
    selection = top_entropy_mask(entropy, mask, quantile)
    expected = reference_mask(entropy.numpy(), mask.numpy(), quantile)
    assert np.array_equal(selection.mask.numpy() != 0, expected)
    n_valid = int(mask.sum())
    if n_valid:
        assert selection.n_kept >= kept_count(n_valid, quantile)  # at least the top k, more only through ties
        if not levels and entropy[mask.bool()].unique().numel() == n_valid:
            assert selection.n_kept == kept_count(n_valid, quantile)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 200), seed=st.integers(0, 2**31 - 1),
       quantile=st.sampled_from([0.1, 0.2, 0.3, 0.5, 0.8]))
def test_torch_quantile_threshold_keeps_the_same_tokens_or_one_fewer(n, seed, quantile):
    """TRL's top_entropy_quantile keeps entropy >= torch.quantile(valid, 1 - quantile) (linear interpolation)."""
    entropy = torch.rand(1, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    mask = torch.ones(1, n, dtype=torch.long)
    ours = top_entropy_mask(entropy, mask, quantile).mask.bool()
    interpolated = entropy >= torch.quantile(entropy[0], 1 - quantile)
    assert bool((interpolated & ~ours).sum() == 0)  # everything it keeps, we keep
    assert int(ours.sum() - interpolated.sum()) in (0, 1)


def test_hand_worked_batch_per_response():
    # quantile 0.5 of each response: row 0 has 4 valid tokens, keeps 2 (0.9, 0.8); row 1 has 2, keeps 1 (0.3, its
    # own top, though the batch's top ceil(0.5 x 6) = 3 take none of its tokens); row 2 has none, keeps none
    entropy = torch.tensor([[0.9, 0.1, 0.5, 0.8], [0.3, 0.2, 0.95, 0.6], [0.7, 0.7, 0.7, 0.7]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    selection = top_entropy_mask(entropy, mask, 0.5, per_response=True)
    assert torch.equal(selection.mask, torch.tensor([[1, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0]]))
    assert selection.n_valid == 6 and selection.n_kept == 3 and selection.threshold is None
    assert selection.kept_entropy_mean == pytest.approx((0.9 + 0.8 + 0.3) / 3)
    metrics = selection.metrics()
    assert metrics["egpo/token_selection/response_threshold_mean"] == pytest.approx((0.8 + 0.3) / 2)
    assert "egpo/token_selection/entropy_threshold" not in metrics
    assert torch.equal(top_entropy_mask(entropy, mask, 0.5).mask,  # the batch's top 3
                       torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0]]))


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 6), cols=st.integers(1, 9), seed=st.integers(0, 2**31 - 1),
    quantile=st.sampled_from([0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 0.8, 0.95, 1.0, 0.1234567890123456]),
    levels=st.sampled_from([0, 3]),
)
def test_per_response_matches_the_float64_reference_row_by_row(rows, cols, seed, quantile, levels):
    """Each row's selection is the batch reference applied to that row alone (the many-digit quantile takes the
    exact path in Python's integers)."""
    g = torch.Generator().manual_seed(seed)
    entropy = torch.rand(rows, cols, generator=g)
    if levels:
        entropy = torch.floor(entropy * levels) / levels
    mask = (torch.rand(rows, cols, generator=g) < 0.7).long()
    selection = top_entropy_mask(entropy, mask, quantile, per_response=True)
    expected = np.stack([reference_mask(entropy[i:i + 1].numpy(), mask[i:i + 1].numpy(), quantile)[0]
                         for i in range(rows)])
    assert np.array_equal(selection.mask.numpy() != 0, expected)
    assert selection.n_kept == int(expected.sum()) and selection.n_valid == int(mask.sum())


def test_a_many_digit_quantile_over_long_responses_keeps_the_exact_count():
    """ceil(quantile x N_i) outside int64 (denominator 1e16, 600 tokens) takes Python's integers: the reference's
    count, row by row."""
    from fractions import Fraction

    quantile = 0.1234567890123457
    assert Fraction(repr(quantile)).denominator * 600 >= 2**62
    g = torch.Generator().manual_seed(5)
    entropy = torch.rand(3, 600, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 600, dtype=torch.long)
    mask[1, 450:] = 0
    selection = top_entropy_mask(entropy, mask, quantile, per_response=True)
    expected = np.stack([reference_mask(entropy[i:i + 1].numpy(), mask[i:i + 1].numpy(), quantile)[0]
                         for i in range(3)])
    assert np.array_equal(selection.mask.numpy() != 0, expected)
    assert selection.mask.sum(1).tolist() == [kept_count(n, quantile) for n in (600, 450, 600)]


def test_no_valid_token_and_bad_input():
    empty = top_entropy_mask(torch.rand(2, 3), torch.zeros(2, 3, dtype=torch.long), 0.2)
    assert empty.n_kept == 0 and empty.threshold is None
    assert "egpo/token_selection/entropy_threshold" not in empty.metrics()
    entropy = torch.rand(2, 3)
    entropy[1, 1] = float("nan")  # one of six valid tokens: above the share a batch may lose
    with pytest.raises(ValueError, match="NaN or inf on 1 of the batch's 6 valid"):
        top_entropy_mask(entropy, torch.ones(2, 3), 0.2)
    with pytest.raises(ValueError, match="aligned 1:1"):
        top_entropy_mask(torch.rand(2, 3), torch.ones(2, 4), 0.2)
    for bad in (0, 0.0, -0.1, 1.5, True, "0.2"):
        with pytest.raises(ValueError, match=r"egpo_top_entropy_quantile must lie in \(0, 1\]"):
            validate_token_selection("top_entropy", bad)
    with pytest.raises(ValueError, match="'all', 'top_entropy', 'top_entropy_per_response'"):
        validate_token_selection("top-entropy", 0.2)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_verls_aggregation_runs_over_the_kept_tokens(loss_agg_mode):
    """verl's agg_loss (what the actor's policy loss ends in) given the narrowed mask: the loss over the kept tokens,
    aggregated as loss_agg_mode says, not a mean over every token with the others zeroed; quantile 1 is the loss
    without selection, bit for bit."""
    from verl.trainer.ppo.core_algos import agg_loss

    g = torch.Generator().manual_seed(3)
    loss = torch.randn(6, 10, generator=g)
    entropy = torch.rand(6, 10, generator=g)
    mask = torch.ones(6, 10, dtype=torch.long)
    mask[:, 7:] = 0
    mask[2, 3:] = 0
    assert torch.equal(agg_loss(loss, top_entropy_mask(entropy, mask, 1.0).mask, loss_agg_mode),
                       agg_loss(loss, mask, loss_agg_mode))
    kept = top_entropy_mask(entropy, mask, 0.2).mask
    got = agg_loss(loss, kept, loss_agg_mode)
    lo, k = loss.double(), kept.double()
    rows = k.sum(1) > 0  # verl's seq-mean modes leave out a response with no kept token
    if loss_agg_mode == "token-mean":
        expected = (lo * k).sum() / k.sum()
    elif loss_agg_mode == "seq-mean-token-mean":
        expected = ((lo * k).sum(1)[rows] / k.sum(1)[rows]).mean()
    else:
        expected = (lo * k).sum(1)[rows].mean()
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    diluted = (lo * k).sum() / mask.double().sum()  # zeroed advantages under the full mask's token mean
    if loss_agg_mode == "token-mean":
        assert not torch.isclose(got.double(), diluted)


def smoke(*overrides):
    from hydra import compose, initialize_config_dir

    from test_recipes import RECIPES

    with initialize_config_dir(config_dir=str(RECIPES), version_base=None):
        return compose(config_name="cpu_smoke", overrides=list(overrides))


def test_settings_read_the_selection():
    cfg = smoke("++algorithm.egpo_token_selection=top_entropy", "++algorithm.egpo_top_entropy_quantile=0.3")
    settings = EgpoSettings.from_algorithm(cfg.algorithm)
    assert settings.selects_tokens and settings.algo.egpo_top_entropy_quantile == 0.3
    assert "policy gradient on the top 0.3 of the batch's tokens by entropy" in settings.variant
    assert not EgpoSettings.from_algorithm(smoke().algorithm).selects_tokens and not settings.selects_per_response
    per_response = EgpoSettings.from_algorithm(
        smoke("++algorithm.egpo_token_selection=top_entropy_per_response").algorithm)
    assert per_response.selects_tokens and per_response.selects_per_response
    assert "policy gradient on the top 0.2 of each response's tokens by entropy" in per_response.variant
    with pytest.raises(EgpoConfigError, match="egpo_top_entropy_quantile must lie"):
        EgpoSettings.from_algorithm(smoke("++algorithm.egpo_token_selection=top_entropy",
                                          "++algorithm.egpo_top_entropy_quantile=0").algorithm)


@pytest.mark.parametrize("conflict", [
    ("algorithm.adv_estimator=grpo",),
    ("actor_rollout_ref.actor.entropy_coeff=0.001",),
    ("actor_rollout_ref.actor.use_kl_loss=true",),
    ("algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.use_kl_loss=true"),
])
@pytest.mark.parametrize("scope", ["top_entropy", "top_entropy_per_response"])
def test_a_loss_that_is_not_the_policy_gradient_alone_is_refused_with_a_fix_that_works(conflict, scope):
    from egpo.preflight.findings import refuse
    from egpo.preflight.token_selection import check_token_selection

    selection = (f"++algorithm.egpo_token_selection={scope}",)
    cfg = smoke(*selection, *conflict)
    with pytest.raises(EgpoConfigError, match=f"egpo_token_selection={scope} ") as err:
        refuse(check_token_selection(*with_facts(cfg, settings=EgpoSettings.from_algorithm(cfg.algorithm))))
    (fix,) = err.value.fixes
    assert " ".join(fix) in str(err.value)
    fixed = smoke(*selection, *conflict, *fix)
    settings = EgpoSettings.from_algorithm(fixed.algorithm)
    refuse(check_token_selection(*with_facts(fixed, settings=settings)))
    assert settings.selects_tokens


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_stray_non_finite_entropy_is_never_kept_and_counted(bad):
    """One NaN or inf among 200 valid tokens (0.5%, under the 1% limit): the selection over the other 199 is the one
    of a batch without that token, bit for bit, and the token is counted, not kept."""
    g = torch.Generator().manual_seed(3)
    entropy = torch.rand(4, 60, generator=g)
    mask = torch.ones(4, 60)
    mask[:, 50:] = 0  # 200 valid tokens
    entropy[2, 7] = bad
    selection = top_entropy_mask(entropy, mask, 0.2)
    without = mask.clone()
    without[2, 7] = 0
    reference = top_entropy_mask(entropy, without, 0.2)
    assert torch.equal(selection.mask, reference.mask) and selection.mask[2, 7] == 0
    assert selection.threshold == reference.threshold and selection.n_kept == reference.n_kept == 40  # ceil(0.2 x 199)
    assert selection.metrics()["egpo/token_selection/nonfinite_tokens"] == 1.0
    assert reference.metrics()["egpo/token_selection/nonfinite_tokens"] == 0.0
    entropy[0, :3] = bad  # 4 of 200: over the limit
    with pytest.raises(ValueError, match="NaN or inf on 4 of the batch's 200 valid"):
        top_entropy_mask(entropy, mask, 0.2)
