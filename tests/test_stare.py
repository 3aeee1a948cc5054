"""STARE (egpo.advantage.stare) against independent references: a token-by-token loop of the authors' selection
(hp-luo/STARE @3ad99d9, verl/trainer/ppo/core_algos.py:1070-1198: per sign set, the top ceil(P x n) tokens by
surprisal, weight W on the positive set's, M on the negative set's for C2, all 1 with the gate off), hand-worked
batches (equal-reward groups, masked tokens, non-finite values, the gate on and off), verl's own policy loss for the
claim that scaling the advantage is the authors' scaling of the loss, and the trainer's advantage step."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

from egpo.advantage.config import EgpoAlgorithmConfig
from egpo.advantage.stare import stare_weights
from test_trainer_policy import BS, L, RecordingWorkerGroup, make_batch, make_trainer, run_step
from test_trainer_policy import verl_worker_calls  # noqa: F401 - the fixture the trainer test below uses

DEFAULTS = dict(variant="O1", top_ratio=0.1, w=1.1, m=0.9, target_entropy=0.3)


def loop_reference(advantages, log_probs, entropy, mask, *, variant, top_ratio, w, m, target_entropy):
    """The authors' selection, one token at a time in float64 (distinct surprisals: no ties to break)."""
    bs, length = len(advantages), len(advantages[0])
    tokens = [(i, t) for i in range(bs) for t in range(length) if mask[i][t]]
    finite_h = [float(entropy[i][t]) for i, t in tokens if math.isfinite(float(entropy[i][t]))]
    gate = bool(finite_h) and sum(finite_h) / len(finite_h) < target_entropy
    weights = [[1.0] * length for _ in range(bs)]
    if not gate:
        return weights, gate
    for sign, weight in ((1, w), (-1, m)):
        if sign < 0 and variant != "C2":
            continue
        members = [(i, t) for i, t in tokens if (advantages[i][t] > 0 if sign > 0 else advantages[i][t] < 0)
                   and math.isfinite(-float(log_probs[i][t]))]
        if not members:
            continue
        k = min(len(members), max(1, int(len(members) * top_ratio + 0.999999)))  # the authors' rounding
        for i, t in sorted(members, key=lambda it: -float(log_probs[it[0]][it[1]]), reverse=True)[:k]:
            weights[i][t] = weight
    return weights, gate


def grpo(scores, groups):
    scores = torch.tensor(scores, dtype=torch.float32)[:, None]
    return compute_grpo_outcome_advantage(scores, torch.ones_like(scores), np.array(groups, dtype=object))[0]


def test_a_hand_worked_batch():
    """Two groups of two: group a (scores 1, 0) gives A = +-0.7071, group b (1, 1) all zero. T+ is response 0's three
    valid tokens; 0.4 of 3 is 2 (ceil 1.2), so its two highest-surprisal tokens get W; T- (response 1) only under
    C2; response 2 and 3 (A = 0) and the masked token never."""
    a = grpo([1, 0, 1, 1], ["a", "a", "b", "b"]).expand(4, 4).clone()
    log_probs = torch.log(torch.tensor([[0.9, 0.2, 0.5, 0.01],   # the last token is masked: never chosen
                                        [0.3, 0.8, 0.1, 0.6],
                                        [0.01, 0.01, 0.01, 0.01],
                                        [0.5, 0.5, 0.5, 0.5]]))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
    entropy = torch.full((4, 4), 0.2)
    o1 = stare_weights(a, log_probs, entropy, mask, **{**DEFAULTS, "top_ratio": 0.4})
    assert o1.gate_on and o1.batch_entropy == pytest.approx(0.2)
    expected = torch.ones(4, 4)
    expected[0, 1] = expected[0, 2] = 1.1  # p 0.2 and 0.5: the two highest surprisals of 0.9, 0.2, 0.5
    torch.testing.assert_close(o1.weights, expected)
    c2 = stare_weights(a, log_probs, entropy, mask, **{**DEFAULTS, "top_ratio": 0.4, "variant": "C2"})
    expected[1, 2] = expected[1, 0] = 0.9  # of 0.3, 0.8, 0.1, 0.6: 0.4 x 4 -> 2: p 0.1 and 0.3
    torch.testing.assert_close(c2.weights, expected)
    assert (c2.n_positive, c2.n_negative, c2.n_selected_positive, c2.n_selected_negative) == (3, 4, 2, 2)
    assert o1.metrics()["egpo/stare/mean_weight"] == pytest.approx((13 + 2 * 1.1) / 15)  # 15 valid tokens
    assert c2.metrics()["egpo/stare/mean_weight"] == pytest.approx((11 + 2 * 1.1 + 2 * 0.9) / 15)


def test_the_gate_at_and_above_the_target_leaves_every_advantage_as_it_was():
    a = grpo([1, 0], ["a", "a"]).expand(2, 3).clone()
    log_probs = torch.log(torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]))
    mask = torch.ones(2, 3)
    for level in (0.3, 0.31):
        found = stare_weights(a, log_probs, torch.full((2, 3), level), mask, **DEFAULTS)
        assert not found.gate_on and torch.equal(found.weights, torch.ones(2, 3))
        assert found.n_selected_positive == 1  # selected, not applied: the metrics say what the gate held back
    below = stare_weights(a, log_probs, torch.full((2, 3), 0.29), mask, **DEFAULTS)
    assert below.gate_on and below.weights[0, 0] == pytest.approx(1.1)  # ceil(0.1 x 3) = 1: p 0.1


def test_non_finite_values_are_never_selected_and_left_out_of_the_gate():
    a = grpo([1, 0], ["a", "a"]).expand(2, 3).clone()
    log_probs = torch.tensor([[-float("inf"), -1.0, -2.0], [-1.0, -1.0, -1.0]])
    entropy = torch.tensor([[float("nan"), 0.1, 0.1], [0.1, float("inf"), 0.1]])
    found = stare_weights(a, log_probs, entropy, torch.ones(2, 3), **DEFAULTS)
    assert found.gate_on and found.batch_entropy == pytest.approx(0.1) and found.n_nonfinite == 1
    assert found.weights[0].tolist() == pytest.approx([1.0, 1.0, 1.1])  # -log p = 2 is the top finite one


def test_a_batch_of_equal_reward_groups_has_nothing_to_reweight():
    a = grpo([1, 1, 0, 0], ["a", "a", "b", "b"]).expand(4, 3).clone()
    found = stare_weights(a, torch.full((4, 3), -1.0), torch.full((4, 3), 0.1), torch.ones(4, 3),
                          **{**DEFAULTS, "variant": "C2"})
    assert found.gate_on and torch.equal(found.weights, torch.ones(4, 3))
    assert found.n_positive == found.n_negative == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.sampled_from(["O1", "C2"]), st.sampled_from([0.05, 0.1, 0.3, 1.0]),
       st.integers(0, 10_000))
def test_the_selection_is_the_authors_on_random_batches(groups, length, variant, ratio, seed):
    g = torch.Generator().manual_seed(seed)
    bs = 2 * groups
    scores = torch.randint(0, 2, (bs,), generator=g).tolist()
    a = grpo(scores, [str(i // 2) for i in range(bs)]).expand(bs, length).clone()
    log_probs = -torch.rand(bs, length, generator=g, dtype=torch.float64) * 5 - 1e-3  # distinct surprisals
    mask = (torch.rand(bs, length, generator=g) < 0.8).long()
    entropy = torch.rand(bs, length, generator=g) * 0.5
    options = {**DEFAULTS, "variant": variant, "top_ratio": ratio, "target_entropy": 0.5}
    expected, gate = loop_reference(a.tolist(), log_probs.tolist(), entropy.tolist(), mask.tolist(), **options)
    found = stare_weights(a, log_probs, entropy, mask, **options)
    assert found.gate_on == gate
    torch.testing.assert_close(found.weights.double(), torch.tensor(expected, dtype=torch.float64))


@pytest.mark.parametrize("seed", range(5))
def test_scaling_the_advantage_is_the_authors_scaling_of_verls_loss(seed):
    """The authors multiply each token's clipped surrogate (verl's dual clip) by its weight; egpo multiplies the
    advantage. verl's own vanilla loss, one token at a time: loss(w x A) == w x loss(A) for w > 0, either sign of A,
    ratios inside and outside both clips."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    g = torch.Generator().manual_seed(seed)
    n = 64
    advantages = torch.randn(1, n, generator=g, dtype=torch.float64)
    log_prob = torch.randn(1, n, generator=g, dtype=torch.float64) * 0.5  # ratios well outside 0.8 .. 1.28 too
    old = torch.randn(1, n, generator=g, dtype=torch.float64) * 0.5
    weights = torch.where(torch.rand(1, n, generator=g) < 0.5, 1.1, 0.9).double()
    config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                               "clip_ratio_c": 3.0, "loss_agg_mode": "token-mean",
                               "policy_loss": {"loss_mode": "vanilla"}, "global_batch_info": {}})

    def token_loss(adv, t):
        one = torch.zeros(1, n, dtype=torch.float64)
        one[0, t] = 1
        try:
            out = compute_policy_loss_vanilla(old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=one,
                                              loss_agg_mode="token-mean", config=config)
        except TypeError:  # an older signature
            out = compute_policy_loss_vanilla(old, log_prob, adv, one, "token-mean", config)
        return out[0]

    for t in range(n):
        assert float(token_loss(advantages * weights, t)) == pytest.approx(float(weights[0, t] * token_loss(advantages, t)),
                                                                            rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("overrides, message", [
    ({"egpo_token_reweighting": "stair"}, "is not one of 'none', 'stare'"),
    ({"stare_variant": "O2"}, "is not one of 'O1', 'C2'"),
    ({"stare_top_ratio": 0.0}, r"must lie in \(0, 1\]"),
    ({"stare_w": -1.1}, "must be > 0"),
    ({"stare_target_entropy": float("nan")}, "must be a finite number"),
])
def test_settings_out_of_range_are_refused_with_the_published_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        EgpoAlgorithmConfig.from_node(overrides)
    assert EgpoAlgorithmConfig.from_node({}).stare_top_ratio == 0.1


@pytest.mark.usefixtures("verl_worker_calls")
def test_through_the_trainers_advantage_step():
    """GRPO with STARE, the actor's entropy below the target: each advantage is GRPO's times the weight the authors'
    selection gives, with the surprisal from verl's recompute (old_log_probs); the metrics are logged."""
    trainer = make_trainer("algorithm.adv_estimator=egpo", "algorithm.egpo_lambda=0",
                           "algorithm.egpo_token_reweighting=stare", "algorithm.stare_top_ratio=0.5")
    g = torch.Generator().manual_seed(3)
    actor_entropy = torch.rand(BS, L, generator=g) * 0.2
    group = RecordingWorkerGroup(actor_entropy)
    old_log_probs = -torch.rand(BS, L, generator=g) * 3 - 1e-3
    group.compute_log_prob = lambda batch: __import__("verl").DataProto.from_dict(
        {"old_log_probs": old_log_probs, "entropys": actor_entropy})
    trainer.actor_rollout_wg = group
    batch, _, output = run_step(trainer, make_batch(False), bypass=False)
    mask = batch.batch["response_mask"]
    a = compute_grpo_outcome_advantage(batch.batch["token_level_rewards"], mask, batch.non_tensor_batch["uid"])[0]
    expected, gate = loop_reference(a.tolist(), old_log_probs.tolist(), actor_entropy.tolist(), mask.tolist(),
                                    **{**DEFAULTS, "top_ratio": 0.5})
    assert gate
    torch.testing.assert_close(batch.batch["advantages"].double(),
                               (a.double() * torch.tensor(expected, dtype=torch.float64)) * mask)
    metrics = output.meta_info["metrics"]
    assert metrics["egpo/stare/gate_on"] == 1.0 and metrics["egpo/stare/selected_positive_frac"] > 0
