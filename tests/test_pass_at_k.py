"""pass@k of a validation (egpo.trainer.pass_at_k): the estimator against counting every k-subset of the samples,
hand-worked cases, and the trainer's override on verl's own validation metrics."""

import itertools
from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpo.trainer.pass_at_k import ks_for, pass_at_k_metrics, unbiased_pass_at_k


def by_subsets(solved: list[bool], k: int) -> float:
    """The share of k-subsets of the samples that hold a solved one, by enumerating them."""
    subsets = list(itertools.combinations(range(len(solved)), k))
    return sum(any(solved[i] for i in subset) for subset in subsets) / len(subsets)


@settings(max_examples=200, deadline=None)
@given(solved=st.lists(st.booleans(), min_size=1, max_size=9), data=st.data())
def test_the_estimator_counts_k_subsets(solved, data):
    k = data.draw(st.integers(1, len(solved)))
    assert unbiased_pass_at_k(len(solved), sum(solved), k) == pytest.approx(by_subsets(solved, k), abs=1e-12)


def test_hand_worked_values():
    assert unbiased_pass_at_k(4, 1, 2) == 0.5  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert unbiased_pass_at_k(8, 0, 8) == 0.0 and unbiased_pass_at_k(8, 1, 8) == 1.0
    assert unbiased_pass_at_k(8, 2, 1) == 0.25
    assert ks_for(8) == [1, 2, 4, 8] and ks_for(6) == [1, 2, 4, 6] and ks_for(1) == [1]
    with pytest.raises(ValueError, match="1 <= k <= n"):
        unbiased_pass_at_k(4, 1, 5)


def test_metrics_group_samples_by_problem_and_count_full_scores_only():
    # two problems x 4 samples; the demo's 0.5 (closed thought, wrong answer) is not solved
    uids = ["a"] * 4 + ["b"] * 4
    scores = [1.0, 0.5, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5]
    metrics = pass_at_k_metrics(["demo"] * 8, uids, scores)
    assert set(metrics) == {"val-egpo/pass@1", "val-egpo/pass@2", "val-egpo/pass@4"}
    assert metrics["val-egpo/pass@1"] == pytest.approx((1 / 4 + 0) / 2)
    assert metrics["val-egpo/pass@2"] == pytest.approx((0.5 + 0) / 2)
    assert metrics["val-egpo/pass@4"] == pytest.approx(0.5)
    assert pass_at_k_metrics(["demo"] * 8, uids, scores, solved_score=0.5)["val-egpo/pass@1"] == pytest.approx(7 / 8)
    # interleaved order (verl's repeat(interleave=True) keeps a problem's samples together; any order works)
    order = [0, 4, 1, 5, 2, 6, 3, 7]
    assert pass_at_k_metrics(["demo"] * 8, [uids[i] for i in order], [scores[i] for i in order]) == metrics


def test_several_data_sources_get_their_own_figures():
    sources = ["math"] * 2 + ["aime"] * 2
    metrics = pass_at_k_metrics(sources, ["m", "m", "a", "a"], [1, 0, 0, 0])
    assert metrics["val-egpo/pass@2"] == pytest.approx(0.5)
    assert metrics["val-egpo/math/pass@2"] == 1.0 and metrics["val-egpo/aime/pass@2"] == 0.0
    with pytest.raises(ValueError, match="one data source, uid and score per sample"):
        pass_at_k_metrics(sources, ["m"], [1])


def test_the_trainer_adds_pass_at_k_to_verls_validation_metrics():
    """On verl's own _val_metrics_update (process_validation_metrics): with 0/1 rewards and n samples per problem,
    pass@1 is verl's mean@n and pass@n the share of problems with a solved sample."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from egpo.trainer import pass_at_k
    from egpo.trainer.ray_trainer import EgpoRayPPOTrainer

    pass_at_k.check_verl_shape(RayPPOTrainer)
    trainer = EgpoRayPPOTrainer.__new__(EgpoRayPPOTrainer)
    trainer.solved_score = 1.0
    rng = np.random.default_rng(0)
    problems, n = 16, 8
    uids = [f"p{i}" for i in range(problems) for _ in range(n)]
    rewards = (rng.random(problems * n) < np.repeat(rng.random(problems), n) * 0.6).astype(float).tolist()
    metrics = trainer._val_metrics_update(np.array(["demo"] * len(uids), dtype=object), uids,
                                          {"reward": rewards}, [])
    solved = np.array(rewards).reshape(problems, n)
    assert metrics["val-core/demo/reward/mean@8"] == pytest.approx(metrics["val-egpo/pass@1"])
    assert metrics["val-egpo/pass@8"] == pytest.approx(solved.any(1).mean())
    expected_4 = np.mean([1 - comb(n - int(c), 4) / comb(n, 4) for c in solved.sum(1)])
    assert metrics["val-egpo/pass@4"] == pytest.approx(expected_4)


def test_a_wrong_shape_of_verls_method_is_named():
    from egpo.trainer import pass_at_k
    from egpo.trainer.advantage_step import VerlShapeError

    class Moved:
        def _val_metrics_update(self, data_sources, sample_uids, reward_extra_infos_dict):
            return {}

    with pytest.raises(VerlShapeError, match="_val_metrics_update has parameters"):
        pass_at_k.check_verl_shape(Moved)
