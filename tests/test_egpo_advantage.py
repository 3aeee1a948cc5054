"""The EGPO estimator against verl's GRPO, a float64 reference, hand-worked numbers and properties."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import E, S, egpo_ref, with_declared_defaults
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, compute_grpo_outcome_advantage

import egpo
from egpo import advantage
from egpo.advantage.registry import EntropyNotSuppliedError, egpo_estimator

compute_egpo_advantage = with_declared_defaults(advantage.compute_egpo_advantage)

egpo.register()


def batch(seed, bs=12, length=16, group=4, think_frac=0.8):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (bs,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    responses = torch.randint(1, 6, (bs, length), generator=g)
    opens = torch.rand(bs, generator=g) < think_frac
    responses[opens, 0] = S
    closes = torch.randint(1, length, (bs,), generator=g)
    responses[torch.arange(bs), closes] = torch.where(torch.rand(bs, generator=g) < 0.7, E, responses[torch.arange(bs), closes])
    rewards = torch.zeros(bs, length)
    rewards[torch.arange(bs), lengths - 1] = torch.randint(0, 3, (bs,), generator=g).float()
    entropy = torch.rand(bs, length, generator=g) * 3
    index = np.array([f"p{i // group}" for i in range(bs)], dtype=object)
    return rewards, mask, index, entropy, responses


def test_hand_worked_example():
    # one group of two: scores 1 and 0 -> mean 0.5, std sqrt(0.5) -> A = +-0.5/(0.70710678+1e-6)
    responses = torch.tensor([[S, 1, 2, E, 3], [S, 4, E, 5, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    rewards = torch.tensor([[0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0.0]])
    entropy = torch.tensor([[9.0, 0.2, 0.4, 9.0, 9.0], [9.0, 2.0, 9.0, 9.0, 9.0]])
    adv, ret, diag = compute_egpo_advantage(
        rewards, mask, np.array(["a", "a"], dtype=object), entropy, responses,
        egpo_lambda=0.5, egpo_alpha=2.0, cot_start_token_id=S, cot_end_token_id=E,
    )
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    # row 0: H = 0.3, bound = a/2 ~ 0.354 -> not clipped; row 1: H = 2.0, bound ~ 0.354 -> clipped
    expected = torch.tensor([a + 0.5 * 0.3, -a + 0.5 * (a / 2)])
    torch.testing.assert_close(adv[:, 0], expected.float(), rtol=1e-6, atol=1e-6)
    assert adv[1, 4] == 0  # padding
    assert torch.equal(adv, ret)
    assert diag.clipped_frac.item() == 0.5
    assert diag.no_cot_frac.item() == 0.0
    torch.testing.assert_close(diag.cot_entropy_mean.item(), (0.3 + 2.0) / 2)
    torch.testing.assert_close(diag.bonus_mean.item(), (0.3 + a / 2) / 2, rtol=1e-6, atol=1e-6)
    # what the advantage received: egpo_lambda x the bonus, the same shift the rows above show
    torch.testing.assert_close(diag.applied_bonus_mean.item(), (0.5 * 0.3 + 0.5 * a / 2) / 2, rtol=1e-6, atol=1e-6)
    assert diag.cot_tokens_mean.item() == 1.5


def test_metric_definitions_on_a_hand_built_batch():
    """clipped_frac counts only responses that can be clipped (a span and A_i != 0); bonus-active, equal-reward
    groups and closed thoughts counted by hand."""
    responses = torch.tensor([
        [S, 1, 2, E, 3],  # group a, score 1: H = 0.3 under the bound          closed
        [S, 4, E, 5, 0],  # group a, score 0: H = 2.0, clipped                 closed
        [S, 1, E, 3, 0],  # group b, score 1: A = 0, bound 0 (not clippable)   closed
        [1, 2, E, 3, 4],  # group b, score 1: starts inside, A = 0             closed
        [1, 2, 3, 4, 5],  # group c, score 0: no span                          open
        [S, 1, 2, 3, 4],  # group c, score 1: open span, H = 3.0, clipped      open
    ])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1] * 5, [1] * 5, [1] * 5])
    scores = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    rewards = torch.zeros(6, 5)
    rewards[:, -1] = torch.tensor(scores)
    entropy = torch.tensor([[9, 0.2, 0.4, 9, 9], [9, 2.0, 9, 9, 9], [9, 2.0, 9, 9, 9], [2.0, 2.0, 9, 9, 9],
                            [2.0] * 5, [9, 3.0, 3.0, 3.0, 3.0]])
    index = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    _, _, diag = compute_egpo_advantage(rewards, mask, index, entropy, responses,
                                        cot_start_token_id=S, cot_end_token_id=E)
    assert diag.clipped_frac.item() == pytest.approx(2 / 3)  # rows 1 and 5 of the clippable rows 0, 1, 5
    assert diag.bonus_active_frac.item() == pytest.approx(3 / 6)  # rows 0, 1, 5
    assert diag.equal_reward_group_frac.item() == pytest.approx(1 / 3)  # group b
    assert diag.think_closed_frac.item() == pytest.approx(4 / 6)
    assert diag.no_cot_frac.item() == pytest.approx(1 / 6)
    assert set(diag.as_metrics()) >= {"egpo/bonus_active_frac", "egpo/equal_reward_group_frac",
                                      "egpo/think_closed_frac"}


@pytest.mark.parametrize("granularity", ["response", "token"])
def test_grpo_arm_reports_no_applied_bonus(granularity):
    """egpo_lambda=0 (the GRPO arm) leaves every advantage as GRPO's: the applied bonus and the fraction of changed
    advantages are 0, while the unscaled bonus (a diagnostic of the entropy, the same in every arm) is not."""
    rewards, mask, index, entropy, responses = batch(7)
    adv, _, diag = compute_egpo_advantage(rewards, mask, index, entropy, responses, egpo_lambda=0.0,
                                          granularity=granularity, cot_start_token_id=S, cot_end_token_id=E)
    assert diag.bonus_mean.item() != 0
    assert diag.applied_bonus_mean.item() == 0 and diag.bonus_active_frac.item() == 0
    _, _, egpo = compute_egpo_advantage(rewards, mask, index, entropy, responses, egpo_lambda=0.4,
                                        granularity=granularity, cot_start_token_id=S, cot_end_token_id=E)
    assert egpo.bonus_mean.item() == diag.bonus_mean.item() and egpo.bonus_active_frac.item() > 0
    assert egpo.applied_bonus_mean.item() == pytest.approx(0.4 * egpo.bonus_mean.item())


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_lambda_zero_is_bit_identical_to_verl_grpo(seed, norm):
    rewards, mask, index, entropy, responses = batch(seed)
    rewards[0, 0] = -0.0  # a -0.0 score survives too
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    adv, _, _ = compute_egpo_advantage(rewards, mask, index, entropy, responses, egpo_lambda=0.0,
                                       cot_start_token_id=S, cot_end_token_id=E, norm_adv_by_std_in_grpo=norm)
    assert adv.dtype == grpo.dtype
    assert torch.equal(adv.view(torch.int32), grpo.view(torch.int32))


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("starts_inside", [False, True])
def test_float64_reference(seed, starts_inside):
    rewards, mask, index, entropy, responses = batch(seed, think_frac=0.5)
    si = torch.rand(len(index), generator=torch.Generator().manual_seed(seed)) < 0.5 if starts_inside else None
    adv, _, _ = compute_egpo_advantage(rewards, mask, index, entropy, responses, egpo_lambda=0.4, egpo_alpha=2.0,
                                       cot_start_token_id=S, cot_end_token_id=E, starts_inside=si)
    ref = egpo_ref(rewards.tolist(), mask.tolist(), index, entropy.double().tolist(), responses.tolist(), 0.4, 2.0,
                   S, E, None if si is None else si.tolist())
    ref = torch.tensor(ref, dtype=torch.float64)[:, None] * mask
    torch.testing.assert_close(adv.double(), ref, rtol=1e-5, atol=1e-6)


floats = st.floats(allow_nan=True, allow_infinity=True, width=32)


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    lam=st.floats(0, 1.99),
    alpha=st.floats(0.05, 10).filter(lambda a: a > 0),
    poison=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 15), floats), max_size=6),
)
def test_properties(seed, lam, alpha, poison):
    lam = min(lam, alpha * 0.999)
    rewards, mask, index, entropy, responses = batch(seed)
    for i, t, v in poison:  # NaN / inf / huge / negative entropy anywhere
        entropy[i, t] = v
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    adv, _, diag = compute_egpo_advantage(rewards, mask, index, entropy, responses, egpo_lambda=lam,
                                          egpo_alpha=alpha, cot_start_token_id=S, cot_end_token_id=E)
    a, a2 = grpo[:, 0].double(), adv[:, 0].double()
    assert torch.isfinite(adv).all()
    assert (adv[mask == 0] == 0).all()
    # sign of A kept (lambda < alpha), shift bounded by lambda |A| / alpha
    assert (torch.sign(a2) * torch.sign(a) >= 0).all()
    assert ((a2 - a).abs() <= lam * a.abs() / alpha * (1 + 1e-5) + 1e-7).all()
    # no span -> no bonus
    from egpo.advantage import compute_cot_mask

    no_span = compute_cot_mask(responses, mask, S, E).sum(1) == 0
    assert torch.equal(adv[no_span], grpo[no_span])
    cot = compute_cot_mask(responses, mask, S, E)
    assert diag.nonfinite_entropy_count.item() == int((cot & ~torch.isfinite(entropy)).sum())


def test_nonfinite_entropy_is_left_out_and_counted():
    responses = torch.tensor([[S, 1, 2, 3, E], [S, 1, 2, 3, E], [S, 1, E, 2, 3]])
    mask = torch.ones_like(responses)
    rewards = torch.tensor([[0, 0, 0, 0, 1.0], [0.0] * 5, [0.0] * 5])
    index = np.array(["a", "a", "a"], dtype=object)
    clean = torch.tensor([[0, 0.1, 0.2, 0.3, 0], [0, 0.1, 0.2, 0.3, 0], [0, 0.05, 0, 0, 0]])
    dirty = clean.clone()
    dirty[0, 2] = float("nan")  # inside the span: left out, counted
    dirty[1, 4] = float("inf")  # on a marker (outside the span): irrelevant, not counted
    dirty[2, :] = torch.tensor([0, float("-inf"), 0, float("nan"), float("inf")])  # whole span non-finite
    adv, _, diag = compute_egpo_advantage(rewards, mask, index, dirty, responses,
                                          cot_start_token_id=S, cot_end_token_id=E)
    ref = egpo_ref(rewards.tolist(), mask.tolist(), index, dirty.double().tolist(), responses.tolist(), 0.4, 2.0, S, E)
    torch.testing.assert_close(adv[:, 0].double(), torch.tensor(ref, dtype=torch.float64), rtol=1e-6, atol=1e-7)
    assert diag.nonfinite_entropy_count.item() == 2
    assert torch.isfinite(adv).all()


def test_entropy_carries_no_gradient():
    rewards, mask, index, entropy, responses = batch(1)
    entropy.requires_grad_(True)
    adv, _, _ = compute_egpo_advantage(rewards, mask, index, entropy, responses,
                                       cot_start_token_id=S, cot_end_token_id=E)
    assert not adv.requires_grad


def test_shape_and_coefficient_errors():
    rewards, mask, index, entropy, responses = batch(2)
    kw = dict(cot_start_token_id=S, cot_end_token_id=E)
    with pytest.raises(ValueError, match="token_level_entropy has shape"):
        compute_egpo_advantage(rewards, mask, index, entropy[:, :-1], responses, **kw)
    with pytest.raises(ValueError, match="index"):
        compute_egpo_advantage(rewards, mask, index[:-1], entropy, responses, **kw)
    with pytest.raises(ValueError, match="egpo_alpha must be > 0"):
        compute_egpo_advantage(rewards, mask, index, entropy, responses, egpo_alpha=0.0, **kw)
    with pytest.raises(ValueError, match=r"egpo_lambda must lie in \[0, egpo_alpha\)"):
        compute_egpo_advantage(rewards, mask, index, entropy, responses, egpo_lambda=2.0, **kw)


def test_registered_with_verl_and_refuses_without_entropy():
    assert ADV_ESTIMATOR_REGISTRY["egpo"] is egpo_estimator
    rewards, mask, index, entropy, responses = batch(3)
    with pytest.raises(EntropyNotSuppliedError, match="python -m egpo.main"):
        egpo_estimator(token_level_rewards=rewards, response_mask=mask, index=index, config={})
    cfg = {"egpo_lambda": 0.3, "egpo_alpha": 1.5, "cot_start_token_id": S, "cot_end_token_id": E}
    adv, _ = egpo_estimator(rewards, mask, index=index, config=cfg, token_level_entropy=entropy, responses=responses)
    direct, _, _ = compute_egpo_advantage(rewards, mask, index, entropy, responses, egpo_lambda=0.3,
                                          egpo_alpha=1.5, cot_start_token_id=S, cot_end_token_id=E)
    assert torch.equal(adv, direct)


def test_the_registry_and_the_trainer_refuse_a_thinking_span_without_markers_alike():
    """Both callers reach the estimator through one adapter: no model's ids are assumed for missing markers."""
    from egpo.advantage.egpo import MissingThinkMarkersError

    rewards, mask, index, entropy, responses = batch(3)
    with pytest.raises(MissingThinkMarkersError, match="algorithm.egpo_span=response"):
        egpo_estimator(rewards, mask, index=index, config={}, token_level_entropy=entropy, responses=responses)
    adv, _ = egpo_estimator(rewards, mask, index=index, config={"egpo_span": "response"},
                            token_level_entropy=entropy, responses=responses)
    direct, _, _ = compute_egpo_advantage(rewards, mask, index, entropy, responses, cot_start_token_id=None,
                                          cot_end_token_id=None, span="response")
    assert torch.equal(adv, direct)


def test_registry_keeps_token_id_zero():
    rewards, mask, index, entropy, responses = batch(4)
    responses = responses - 1  # ids 0..4; make 0 the <think> id
    cfg = {"cot_start_token_id": 0, "cot_end_token_id": E}
    adv, _ = egpo_estimator(rewards, mask, index=index, config=cfg, token_level_entropy=entropy, responses=responses)
    direct, _, _ = compute_egpo_advantage(rewards, mask, index, entropy, responses,
                                          cot_start_token_id=0, cot_end_token_id=E)
    assert torch.equal(adv, direct)
