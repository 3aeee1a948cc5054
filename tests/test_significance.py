"""The report's statistics against independent references: brute-force enumeration of every sign assignment,
hand-worked cases, and the bootstrap's coverage on simulated data."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from egpo.significance import bootstrap_ci, compare, holm, seeds_for_power, wilcoxon_signed_rank_p


def brute_force_signed_rank_p(diffs) -> float:
    """Every one of the 2^n sign flips, average ranks for ties, zeros dropped; two-sided around n(n+1)/4."""
    values = [d for d in diffs if d != 0]
    n = len(values)
    if n == 0:
        return 1.0
    magnitudes = sorted(abs(v) for v in values)
    rank = {m: (magnitudes.index(m) + 1 + len(magnitudes) - magnitudes[::-1].index(m)) / 2 for m in magnitudes}
    ranks = [rank[abs(v)] for v in values]
    centre = sum(ranks) / 2
    observed = abs(sum(r for r, v in zip(ranks, values) if v > 0) - centre)
    extreme = sum(1 for signs in itertools.product((0, 1), repeat=n)
                  if abs(sum(r for r, s in zip(ranks, signs) if s) - centre) >= observed - 1e-9)
    return extreme / 2 ** n


def test_hand_worked_signed_rank_p_values():
    assert wilcoxon_signed_rank_p([1, 2, 3, 4, 5]) == pytest.approx(2 / 32)  # only all-+ and all-- are as extreme
    assert wilcoxon_signed_rank_p([-1, -2, -3, -4, -5]) == pytest.approx(2 / 32)
    # 12 seeds, every one in the same direction: p = 2 / 4096
    assert wilcoxon_signed_rank_p(np.arange(1, 13) * 0.1) == pytest.approx(2 / 4096)
    assert wilcoxon_signed_rank_p([0, 0, 0]) == 1.0  # no non-zero difference: no evidence
    assert wilcoxon_signed_rank_p([1, -1]) == 1.0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-4, 4).map(lambda k: k * 0.5), min_size=1, max_size=10))
def test_exact_p_equals_brute_force_enumeration(diffs):  # ties and zeros included (a half-step grid)
    assert wilcoxon_signed_rank_p(diffs) == pytest.approx(brute_force_signed_rank_p(diffs), abs=1e-12)


def test_bootstrap_interval_is_deterministic_and_sensible():
    diffs = [0.5, 0.0, 1.5, 0.2, 0.9]
    assert bootstrap_ci(diffs) == bootstrap_ci(diffs)  # same seed, same interval
    low, high = bootstrap_ci(diffs)
    assert low < np.mean(diffs) < high and min(diffs) <= low and high <= max(diffs)
    assert bootstrap_ci([0.3, 0.3, 0.3]) == pytest.approx((0.3, 0.3))
    assert bootstrap_ci([2.0]) == (2.0, 2.0)
    with pytest.raises(ValueError, match="non-finite"):
        bootstrap_ci([1.0, math.nan])


def test_bootstrap_interval_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(123)
    trials, covered = 300, 0
    for t in range(trials):
        sample = rng.normal(0.4, 1.0, size=12)
        low, high = bootstrap_ci(sample, resamples=2000, seed=t)
        covered += low <= 0.4 <= high
    # the percentile bootstrap under-covers slightly at n=12 (about 92-93%); 300 trials: +-2.5% at 1 sd
    assert 0.86 <= covered / trials <= 0.99, covered / trials


def test_seeds_for_power_hand_worked():
    # d = 1: (1.96 + 0.8416)^2 + 1.96^2 / 2 = 7.85 + 1.92 -> 10 seeds
    assert seeds_for_power(1.0, 1.0) == 10
    # d = 0.5: 31.40 + 1.92 -> 34
    assert seeds_for_power(-0.5, 1.0) == 34
    assert seeds_for_power(0.0, 1.0) is None and seeds_for_power(1.0, 0.0) is None
    # a mean at rounding level (differences that cancel exactly, summed in floating point) is no difference
    assert seeds_for_power(-9.25e-18, 0.0166) is None and seeds_for_power(1e-6, 0.0166) is not None


def test_holm_hand_worked():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> kept monotone: 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0]) and holm([]) == [] and holm([0.2]) == [0.2]


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30))
def test_holm_against_its_step_down_definition(p_values):
    """A family member is rejected at level a by Holm's procedure iff its adjusted p-value is below a."""
    adjusted = holm(p_values)
    m = len(p_values)
    for a in (0.01, 0.05, 0.2):
        order = sorted(range(m), key=p_values.__getitem__)
        rejected = set()
        for rank, index in enumerate(order):  # step down: stop at the first that fails its threshold
            if (m - rank) * p_values[index] > a:
                break
            rejected.add(index)
        assert {i for i in range(m) if adjusted[i] <= a} == rejected
    assert all(p <= q <= 1.0 for p, q in zip(p_values, adjusted))


def test_compare_combines_them():
    result = compare([0.5, 0.0, 1.5])
    assert result.n_seeds == 3 and result.mean_diff == pytest.approx(2 / 3) and result.seeds_positive == 2
    assert result.sd == pytest.approx(0.7638, abs=1e-4)
    assert result.p_value == pytest.approx(brute_force_signed_rank_p([0.5, 0.0, 1.5]))
    assert not result.significant
    assert compare(np.arange(1, 13) * 0.1).significant
