"""The estimator family: egpo_granularity (response | token) x egpo_span (cot | response), against verl's GRPO,
a float64 reference, Cheng et al.'s own form, hand-worked numbers and properties."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import E, S, egpo_tokens_ref, with_declared_defaults
from test_egpo_advantage import batch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from egpo import advantage
from egpo.advantage import GRANULARITIES, SPANS, compute_cot_mask
from egpo.advantage.registry import egpo_estimator

compute_egpo_advantage = with_declared_defaults(advantage.compute_egpo_advantage)

VARIANTS = [(g, s) for g in GRANULARITIES for s in SPANS]
IDS = [f"{g}-{s}" for g, s in VARIANTS]


def run(rewards, mask, index, entropy, responses, granularity, span, **kw):
    kw.setdefault("cot_start_token_id", S)
    kw.setdefault("cot_end_token_id", E)
    return compute_egpo_advantage(rewards, mask, index, entropy, responses, granularity=granularity,
                                  span=span, **kw)


def reference(rewards, mask, index, entropy, responses, granularity, span, lam=0.4, alpha=2.0, starts_inside=None,
              norm=True):
    return torch.tensor(egpo_tokens_ref(rewards.tolist(), mask.tolist(), index, entropy.double().tolist(),
                                        responses.tolist(), lam, alpha, S, E, starts_inside, norm, granularity, span),
                        dtype=torch.float64)


@pytest.mark.parametrize("granularity, span", VARIANTS, ids=IDS)
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_lambda_zero_is_bit_identical_to_verl_grpo(seed, norm, granularity, span):
    rewards, mask, index, entropy, responses = batch(seed)
    rewards[0, 0] = -0.0
    entropy[1, 2] = float("nan")
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    adv, ret, _ = run(rewards, mask, index, entropy, responses, granularity, span, egpo_lambda=0.0,
                      norm_adv_by_std_in_grpo=norm)
    assert adv.dtype == grpo.dtype
    assert torch.equal(adv.view(torch.int32), grpo.view(torch.int32))
    assert torch.equal(ret, adv)


@pytest.mark.parametrize("granularity, span", VARIANTS, ids=IDS)
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("starts_inside", [False, True])
def test_float64_reference(seed, starts_inside, granularity, span):
    rewards, mask, index, entropy, responses = batch(seed, think_frac=0.5)
    si = torch.rand(len(index), generator=torch.Generator().manual_seed(seed)) < 0.5 if starts_inside else None
    adv, _, _ = run(rewards, mask, index, entropy, responses, granularity, span, starts_inside=si)
    ref = reference(rewards, mask, index, entropy, responses, granularity, span,
                    starts_inside=None if si is None else si.tolist())
    torch.testing.assert_close(adv.double(), ref, rtol=1e-5, atol=1e-6)


def test_token_level_is_cheng_et_al_with_their_alpha_and_kappa():
    """psi(H_t) = min(alpha_c * H_t, |A_t| / kappa), alpha_c = egpo_lambda, kappa = egpo_alpha / egpo_lambda, added
    on the span's tokens (entropy >= 0, so EGPO's lower clip never acts)."""
    rewards, mask, index, entropy, responses = batch(7)
    lam, alpha = 0.3, 1.5
    alpha_c, kappa = lam, alpha / lam
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index)
    adv, _, _ = run(rewards, mask, index, entropy, responses, "token", "response", egpo_lambda=lam, egpo_alpha=alpha)
    a = grpo.double()
    psi = torch.minimum(alpha_c * entropy.double(), a.abs() / kappa)
    torch.testing.assert_close(adv.double(), (a + psi) * mask, rtol=1e-5, atol=1e-6)


def test_hand_worked_token_level():
    # group of two, scores 1 and 0: A = +-a, a = 0.5 / (sqrt(0.5) + 1e-6); bound = a / 2 ~ 0.354
    responses = torch.tensor([[S, 1, 2, E, 3], [S, 4, E, 5, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    rewards = torch.tensor([[0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0.0]])
    entropy = torch.tensor([[9.0, 0.2, 0.4, 9.0, 0.1], [0.3, 2.0, 0.05, float("nan"), 9.0]])
    index = np.array(["a", "a"], dtype=object)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    b = a / 2
    adv, _, diag = run(rewards, mask, index, entropy, responses, "token", "cot", egpo_lambda=0.5)
    # cot span: row 0 tokens 1, 2 (0.4 > b: clipped); row 1 token 1 (clipped)
    expected = torch.tensor([[a, a + 0.5 * 0.2, a + 0.5 * b, a, a], [-a, -a + 0.5 * b, -a, -a, 0.0]])
    torch.testing.assert_close(adv, expected, rtol=1e-6, atol=1e-6)
    assert diag.clipped_frac.item() == pytest.approx(2 / 3)  # 3 span tokens, two clipped
    assert diag.nonfinite_entropy_count.item() == 0
    adv, _, diag = run(rewards, mask, index, entropy, responses, "token", "response", egpo_lambda=0.5)
    # every valid token; row 0's 9.0, 0.4, 9.0 are clipped, row 1's nan is left out (A there), its 2.0 clipped
    expected = torch.tensor([[a + 0.5 * b, a + 0.1, a + 0.5 * b, a + 0.5 * b, a + 0.05],
                             [-a + 0.15, -a + 0.5 * b, -a + 0.025, -a, 0.0]])
    torch.testing.assert_close(adv, expected, rtol=1e-6, atol=1e-6)
    assert diag.nonfinite_entropy_count.item() == 1
    assert diag.clipped_frac.item() == pytest.approx(4 / 8)
    assert diag.span_entropy_mean.item() == pytest.approx(((9 + 0.2 + 0.4 + 9 + 0.1) / 5 + (0.3 + 2 + 0.05) / 3) / 2)


def test_hand_worked_response_span():
    responses = torch.tensor([[S, 1, 2, E, 3], [1, 2, 3, 4, 0]])  # row 1 never thinks
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    rewards = torch.tensor([[0, 0, 0, 0, 0.0], [0, 0, 0, 0, 1.0]])
    entropy = torch.tensor([[0.1, 0.2, 0.4, 0.1, 0.2], [0.4, 0.2, 0.1, 0.1, 9.0]])
    index = np.array(["a", "a"], dtype=object)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    adv, _, diag = run(rewards, mask, index, entropy, responses, "response", "response", egpo_lambda=0.5)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-a + 0.5 * 0.2, a + 0.5 * 0.2]), rtol=1e-6, atol=1e-6)
    assert adv[1, 4] == 0
    # the thinking-span figures still describe the thinking span
    assert diag.no_cot_frac.item() == 0.5 and diag.cot_entropy_mean.item() == pytest.approx(0.3)
    assert diag.response_entropy_mean.item() == pytest.approx(0.2)
    # the same batch with egpo_span=cot: row 1 has no span, no bonus
    adv, _, _ = run(rewards, mask, index, entropy, responses, "response", "cot", egpo_lambda=0.5)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-a + 0.5 * 0.3, a]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_response_span_needs_no_thinking_markers(granularity):
    rewards, mask, index, entropy, responses = batch(3)
    adv, _, diag = run(rewards, mask, index, entropy, responses, granularity, "response", cot_start_token_id=None,
                       cot_end_token_id=None)
    ref = reference(rewards, mask, index, entropy, responses, granularity, "response")
    torch.testing.assert_close(adv.double(), ref, rtol=1e-5, atol=1e-6)
    metrics = diag.as_metrics()
    assert {"egpo/cot_entropy_mean", "egpo/no_cot_frac", "egpo/think_closed_frac"}.isdisjoint(metrics)  # undefined
    assert math.isfinite(metrics["egpo/span_entropy_mean"]) and metrics["egpo/bonus_active_frac"] > 0
    with pytest.raises(ValueError, match="egpo_span=response"):
        run(rewards, mask, index, entropy, responses, granularity, "cot", cot_start_token_id=None, cot_end_token_id=None)


@pytest.mark.parametrize("key, value, allowed", [("granularity", "tokens", "'response', 'token'"),
                                                 ("span", "think", "'cot', 'response'")])
def test_unknown_variant_is_refused_with_the_allowed_values(key, value, allowed):
    rewards, mask, index, entropy, responses = batch(0)
    variant = {"granularity": "response", "span": "cot", key: value}
    with pytest.raises(ValueError, match=f"algorithm.egpo_{key}='{value}' is not one of {allowed}"):
        run(rewards, mask, index, entropy, responses, **variant)


floats = st.floats(allow_nan=True, allow_infinity=True, width=32)


@settings(max_examples=120, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    variant=st.sampled_from(VARIANTS),
    lam=st.floats(0, 1.99),
    alpha=st.floats(0.05, 10),
    norm=st.booleans(),
    poison=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 15), floats), max_size=6),
)
def test_properties(seed, variant, lam, alpha, norm, poison):
    granularity, span = variant
    lam = min(lam, alpha * 0.999)
    rewards, mask, index, entropy, responses = batch(seed)
    for i, t, v in poison:  # NaN / inf / huge / negative entropy anywhere
        entropy[i, t] = v
    grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    adv, _, diag = run(rewards, mask, index, entropy, responses, granularity, span, egpo_lambda=lam, egpo_alpha=alpha,
                       norm_adv_by_std_in_grpo=norm)
    a, a2 = grpo.double(), adv.double()
    assert torch.isfinite(adv).all()
    assert (adv[mask == 0] == 0).all()  # padding
    assert (torch.sign(a2) * torch.sign(a) >= 0).all()  # the sign is never flipped
    assert ((a2 - a).abs() <= lam * a.abs() / alpha * (1 + 1e-5) + 1e-7).all()  # the shift is bounded
    torch.testing.assert_close(a2, reference(rewards, mask, index, entropy, responses, granularity, span, lam, alpha,
                                             norm=norm), rtol=1e-5, atol=1e-6)
    reads = compute_cot_mask(responses, mask, S, E) if span == "cot" else mask.bool()
    assert diag.nonfinite_entropy_count.item() == int((reads & ~torch.isfinite(entropy)).sum())
    outside = ~reads & mask.bool()
    if granularity == "token":  # tokens outside the span keep GRPO's advantage
        assert torch.equal(adv[outside], grpo[outside])


@pytest.mark.parametrize("granularity, span", VARIANTS, ids=IDS)
def test_registry_entry_passes_the_variant(granularity, span):
    rewards, mask, index, entropy, responses = batch(5)
    cfg = {"egpo_lambda": 0.3, "egpo_alpha": 1.5, "cot_start_token_id": S, "cot_end_token_id": E,
           "egpo_granularity": granularity, "egpo_span": span}
    adv, _ = egpo_estimator(rewards, mask, index=index, config=cfg, token_level_entropy=entropy, responses=responses)
    direct, _, _ = compute_egpo_advantage(rewards, mask, index, entropy, responses, egpo_lambda=0.3,
                                          egpo_alpha=1.5, cot_start_token_id=S, cot_end_token_id=E,
                                          granularity=granularity, span=span)
    assert torch.equal(adv, direct)
