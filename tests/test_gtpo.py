"""GTPO and GRPO-S (egpo/advantage/gtpo.py) against the equations as ../shared/notes/gtpo-grpo-s.md writes them:
a token-by-token float64 loop of Eqs. 3, 5, 6 and of Eqs. 8, 9 with GRPO's z-score (written from the equations, not
from the implementation), hand-worked batches, and the property the note derives (within a sign the constant part
and the entropy weight's scale cancel)."""

import math
import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from egpo.advantage.gtpo import SHAPING_EPS, ZSCORE_EPS, grpo_s_advantage, gtpo_advantage

EPS = SHAPING_EPS


def _zscored(cells: dict, values: dict) -> dict:
    """The cells' values z-scored over those cells (unbiased standard deviation)."""
    if not cells:
        return {}
    xs = [values[c] for c in cells]
    mean = sum(xs) / len(xs)
    std = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return {c: (values[c] - mean) / (std + ZSCORE_EPS) for c in cells}


def outcome(scores, mask, i):
    """A response's outcome score: its reward, on its last valid token (an empty response has none: 0)."""
    return scores[i] if any(mask[i]) else 0.0


def gtpo_reference(scores, mask, index, H, solved, a1, a2, norm):
    """Eqs. 3, 5, 6 token by token, in Python floats (float64)."""
    B, L = len(mask), len(mask[0])
    correct = [outcome(scores, mask, i) >= solved for i in range(B)]
    valid = lambda k, t: mask[k][t] and math.isfinite(H[k][t])  # noqa: E731
    r = {}
    for i in range(B):
        for t in range(L):
            if not mask[i][t]:
                continue
            if not math.isfinite(H[i][t]):
                r[i, t] = a1 if correct[i] else -a1
                continue
            same = [k for k in range(B) if index[k] == index[i] and correct[k] == correct[i] and valid(k, t)]
            if correct[i]:  # Eq. 3: H / sum H * d_t
                r[i, t] = a1 + a2 * H[i][t] / (sum(H[k][t] for k in same) + EPS) * len(same)
            else:  # Eq. 5: (1/H) / sum (1/H) * h_t
                inv = lambda k: 1.0 / (H[k][t] + EPS)  # noqa: E731
                r[i, t] = -a1 - a2 * inv(i) / sum(inv(k) for k in same) * len(same)
    if norm == "per_sign":  # Eq. 6: each sign z-scored over all of its tokens in the batch
        adv = {**_zscored([c for c in r if correct[c[0]]], r), **_zscored([c for c in r if not correct[c[0]]], r)}
    else:
        adv = _zscored(list(r), r)
    return [[adv.get((i, t), 0.0) for t in range(L)] for i in range(B)], [[r.get((i, t), 0.0) for t in range(L)]
                                                                          for i in range(B)]


def grpo_s_reference(scores, mask, index, H, solved, b1, b2):
    """Eqs. 8, 9 and GRPO's group z-score (a group of one: its score, as verl's GRPO), response by response."""
    B, L = len(mask), len(mask[0])
    correct = [outcome(scores, mask, i) >= solved for i in range(B)]
    mean_h = {}
    for i in range(B):
        hs = [H[i][t] for t in range(L) if mask[i][t] and math.isfinite(H[i][t])]
        if hs:
            mean_h[i] = sum(hs) / len(hs)  # Eq. 8
    shaped = []
    for i in range(B):
        base = b1 if correct[i] else -b1
        if i not in mean_h:
            shaped.append(base)
            continue
        same = [k for k in range(B) if index[k] == index[i] and correct[k] == correct[i] and k in mean_h]
        if correct[i]:
            shaped.append(base + b2 * mean_h[i] / (sum(mean_h[k] for k in same) + EPS) * len(same))
        else:
            inv = lambda k: 1.0 / (mean_h[k] + EPS)  # noqa: E731
            shaped.append(base - b2 * inv(i) / sum(inv(k) for k in same) * len(same))
    adv = []
    for i in range(B):
        group = [shaped[k] for k in range(B) if index[k] == index[i]]
        if len(group) == 1:
            a = shaped[i] / (1.0 + ZSCORE_EPS)
        else:
            a = (shaped[i] - sum(group) / len(group)) / (statistics.stdev(group) + ZSCORE_EPS)
        adv.append([a if mask[i][t] else 0.0 for t in range(L)])
    return adv, shaped


def as_inputs(scores, mask, H):
    mask_t = torch.tensor(mask, dtype=torch.long)
    rewards = torch.zeros(mask_t.shape, dtype=torch.float32)
    last = mask_t.sum(-1).clamp_min(1) - 1  # verl puts the outcome score on the last valid token
    rewards[torch.arange(len(scores)), last] = torch.tensor(scores, dtype=torch.float32)
    return rewards, mask_t, torch.tensor(H, dtype=torch.float64)


def test_gtpo_by_hand_two_correct_responses():
    """A group of two correct responses of two tokens, entropies [1, 2] and [3, 2], a1 = 1, a2 = 0.1: at t=0 the
    shares are 1/4 and 3/4 of d=2, at t=1 half each: rewards 1.05, 1.1 / 1.15, 1.1; z-scored over the four (mean 1.1,
    std sqrt(0.005/3)): the low-entropy first token -1.2247, the high-entropy one +1.2247, the equal ones 0."""
    rewards, mask, H = as_inputs([1.0, 1.0], [[1, 1], [1, 1]], [[1.0, 2.0], [3.0, 2.0]])
    shaped = gtpo_advantage(rewards, mask, np.array(["a", "a"], dtype=object), H, solved_score=1.0, alpha1=1.0,
                            alpha2=0.1, norm="per_sign")
    assert torch.allclose(shaped.rewards, torch.tensor([[1.05, 1.1], [1.15, 1.1]], dtype=torch.float64), atol=1e-6)
    z = 0.05 / (math.sqrt(0.005 / 3) + ZSCORE_EPS)
    assert torch.allclose(shaped.advantages, torch.tensor([[-z, 0.0], [z, 0.0]], dtype=torch.float64), atol=1e-5)


def test_gtpo_by_hand_a_failed_responses_low_entropy_is_punished_more():
    """Two failed responses still generating at t=0 with entropies 1 and 3 (a1 = 1, a2 = 0.1): Eq. 5's inverse shares
    are (1)/(1 + 1/3) = 3/4 and 1/4 of h=2: rewards -1.15 and -1.05; the second response has ended at t=1, so the first
    one's t=1 token is alone (share 1): -1.1. Z-scored over the three: -1.05 (high entropy) is the positive one."""
    rewards, mask, H = as_inputs([0.0, 0.0], [[1, 1], [1, 0]], [[1.0, 2.0], [3.0, 0.0]])
    shaped = gtpo_advantage(rewards, mask, np.array(["a", "a"], dtype=object), H, solved_score=1.0, alpha1=1.0,
                            alpha2=0.1, norm="per_sign")
    assert torch.allclose(shaped.rewards, torch.tensor([[-1.15, -1.1], [-1.05, 0.0]], dtype=torch.float64), atol=1e-5)
    assert shaped.advantages[1, 0] > 0 > shaped.advantages[0, 0] and shaped.advantages[1, 1] == 0


def test_grpo_s_by_hand():
    """One group: two correct responses of mean entropy 1 and 3, one failed of mean entropy 2 (b1 = 1, b2 = 0.1):
    rewards 1 + 0.1 * 1/4 * 2 = 1.05, 1.15, and -1 - 0.1 * 1 = -1.1 (alone in its sign, share 1 of m=1)."""
    rewards, mask, H = as_inputs([1.0, 1.0, 0.0], [[1, 1], [1, 0], [1, 1]], [[0.5, 1.5], [3.0, 9.0], [2.0, 2.0]])
    shaped = grpo_s_advantage(rewards, mask, np.array(["a", "a", "a"], dtype=object), H, solved_score=1.0, beta1=1.0,
                              beta2=0.1)
    assert torch.allclose(shaped.rewards[:, 0], torch.tensor([1.05, 1.15, -1.1], dtype=torch.float64), atol=1e-6)
    x = torch.tensor([1.05, 1.15, -1.1], dtype=torch.float64)
    expected = (x - x.mean()) / (x.std() + ZSCORE_EPS)
    assert torch.allclose(shaped.advantages[:, 0], expected) and shaped.advantages[1, 1] == 0


def batches(draw_lengths=st.integers(1, 5)):
    @st.composite
    def batch(draw):
        groups = draw(st.integers(1, 3))
        per_group = draw(st.integers(1, 4))
        L = draw(st.integers(1, 6))
        B = groups * per_group
        lengths = [draw(st.integers(0, L)) for _ in range(B)]
        mask = [[1 if t < n else 0 for t in range(L)] for n in lengths]
        scores = [draw(st.sampled_from([0.0, 0.5, 1.0])) for _ in range(B)]
        H = [[draw(st.one_of(st.floats(0.0, 5.0), st.just(0.0), st.just(float("nan")), st.just(float("inf"))))
              for _ in range(L)] for _ in range(B)]
        index = [f"g{i // per_group}" for i in range(B)]
        return scores, mask, index, H
    return batch()


@settings(max_examples=200, deadline=None)
@given(batches(), st.sampled_from(["per_sign", "joint"]), st.floats(0.5, 2.0), st.floats(0.01, 0.5))
def test_gtpo_is_the_equations_token_by_token(batch, norm, a1, a2):
    scores, mask, index, H = batch
    rewards, mask_t, H_t = as_inputs(scores, mask, H)
    shaped = gtpo_advantage(rewards, mask_t, np.array(index, dtype=object), H_t, solved_score=1.0, alpha1=a1,
                            alpha2=a2, norm=norm)
    adv, r = gtpo_reference(scores, mask, index, H, 1.0, a1, a2, norm)
    assert torch.allclose(shaped.rewards, torch.tensor(r, dtype=torch.float64), rtol=1e-9, atol=1e-9)
    assert torch.allclose(shaped.advantages, torch.tensor(adv, dtype=torch.float64), rtol=1e-6, atol=1e-6)
    assert shaped.nonfinite == sum(m and not math.isfinite(h) for mr, hr in zip(mask, H) for m, h in zip(mr, hr))


@settings(max_examples=200, deadline=None)
@given(batches(), st.floats(0.5, 2.0), st.floats(0.01, 0.5))
def test_grpo_s_is_the_equations_response_by_response(batch, b1, b2):
    scores, mask, index, H = batch
    rewards, mask_t, H_t = as_inputs(scores, mask, H)
    shaped = grpo_s_advantage(rewards, mask_t, np.array(index, dtype=object), H_t, solved_score=1.0, beta1=b1,
                              beta2=b2)
    adv, shaped_ref = grpo_s_reference(scores, mask, index, H, 1.0, b1, b2)
    assert torch.allclose(shaped.advantages, torch.tensor(adv, dtype=torch.float64), rtol=1e-6, atol=1e-6)


@settings(max_examples=100, deadline=None)
@given(batches(), st.floats(0.5, 2.0), st.floats(0.05, 0.5), st.floats(0.5, 2.0), st.floats(2.0, 4.0))
def test_within_a_sign_the_constant_part_and_the_entropy_weights_scale_cancel(batch, a1, a2, a1_other, scale):
    """The note's derived property of Eq. 6 (per_sign): alpha1 shifts every token of a sign alike and alpha2 scales
    their spread, so the z-scored advantages do not depend on either (up to the epsilon under the deviation), and each
    sign's advantages sum to 0: nothing in Eq. 6 prefers a correct response to a failed one."""
    scores, mask, index, H = batch
    H = [[h if math.isfinite(h) else 1.0 for h in row] for row in H]  # a non-finite token's base reward moves with a1
    rewards, mask_t, H_t = as_inputs(scores, mask, H)
    run = lambda a, b: gtpo_advantage(rewards, mask_t, np.array(index, dtype=object), H_t, solved_score=1.0,  # noqa
                                      alpha1=a, alpha2=b, norm="per_sign").advantages
    first, second = run(a1, a2), run(a1_other, a2 * scale)
    rewards_first = gtpo_advantage(rewards, mask_t, np.array(index, dtype=object), H_t, solved_score=1.0, alpha1=a1,
                                   alpha2=a2, norm="per_sign").rewards
    correct = torch.tensor([outcome(scores, mask, i) >= 1.0 for i in range(len(scores))])
    for sign in (correct, ~correct):
        pool = mask_t.bool() & sign[:, None]
        if int(pool.sum()) < 2 or float(rewards_first[pool].std()) < 1e-2:
            continue  # one token, or rewards equal but for Remark 2.1's epsilon: the z-score's own epsilon decides
        assert torch.allclose(first[pool], second[pool], rtol=1e-3, atol=1e-3)
        assert abs(float(first[pool].sum())) < 1e-6 * int(pool.sum())


def test_all_correct_and_all_failed_groups_have_one_branch_and_padding_gets_nothing():
    rewards, mask, H = as_inputs([1.0, 1.0, 0.0, 0.0], [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]],
                                 [[1.0, 2.0, 9.0], [2.0, 9.0, 9.0], [0.5, 1.0, 2.0], [2.0, 0.0, 9.0]])
    index = np.array(["right", "right", "wrong", "wrong"], dtype=object)
    shaped = gtpo_advantage(rewards, mask, index, H, solved_score=1.0, alpha1=1.0, alpha2=0.1, norm="per_sign")
    assert (shaped.rewards[:2][mask[:2].bool()] > 0).all() and (shaped.rewards[2:][mask[2:].bool()] < 0).all()
    assert (shaped.advantages[~mask.bool()] == 0).all() and (shaped.rewards[~mask.bool()] == 0).all()
    # a failed token of zero entropy holds nearly the whole inverse share at its position
    assert shaped.rewards[3, 1] == pytest.approx(-1.0 - 0.1 * 2, abs=1e-5)
