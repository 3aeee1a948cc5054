"""What an ablation's paired per-seed differences say: a bootstrap confidence interval of the mean difference, an
exact Wilcoxon signed-rank p-value, and the number of seeds a difference of that size would need.

Plain numpy; no scipy. Every function is deterministic: the bootstrap's generator is seeded (``seed``), so the
same differences give the same interval.

* :func:`bootstrap_ci` - percentile bootstrap of the mean (resampling seeds with replacement).
* :func:`wilcoxon_signed_rank_p` - two-sided exact p-value of the signed-rank statistic, zeros dropped (Wilcoxon's
  convention), tied magnitudes given their average rank; the null distribution is enumerated exactly over the
  2^n sign assignments by dynamic programming on (doubled, so integer) ranks.
* :func:`holm` - Holm's adjustment of a family of p-values (every metric, step and arm of a report).
* :func:`seeds_for_power` - seeds for a paired test at level ``alpha`` to detect the observed mean difference with
  ``power``, from the observed spread: Guenther's approximation to the paired t-test,
  n = ((z_{1-alpha/2} + z_{power}) / d)^2 + z_{1-alpha/2}^2 / 2 with d = |mean| / sd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


def bootstrap_ci(diffs, level: float = 0.95, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``diffs``. One value gives a zero-width interval."""
    values = np.asarray(diffs, dtype=np.float64)
    if values.size == 0:
        raise ValueError("bootstrap_ci needs at least one difference")
    if not np.all(np.isfinite(values)):
        raise ValueError("bootstrap_ci got a non-finite difference")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def _average_ranks(magnitudes: np.ndarray) -> np.ndarray:
    order = np.argsort(magnitudes, kind="stable")
    ranks = np.empty(magnitudes.size, dtype=np.float64)
    sorted_values = magnitudes[order]
    i = 0
    while i < sorted_values.size:
        j = i
        while j + 1 < sorted_values.size and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def wilcoxon_signed_rank_p(diffs) -> float:
    """Two-sided exact p-value of Wilcoxon's signed-rank test of "the differences are centred on 0"."""
    values = np.asarray(diffs, dtype=np.float64)
    values = values[values != 0.0]
    n = values.size
    if n == 0:
        return 1.0
    doubled = np.rint(2.0 * _average_ranks(np.abs(values))).astype(np.int64)  # average ranks are k/2: integers
    total = int(doubled.sum())
    # counts[s]: sign assignments whose positive doubled-rank sum is s
    counts = np.zeros(total + 1, dtype=np.float64)
    counts[0] = 1.0
    for r in doubled:
        counts[r:] = counts[r:] + counts[:total + 1 - r].copy()
    w_plus = int(doubled[values > 0].sum())
    # two-sided: as extreme as observed in either direction, around the null mean total / 2
    distance = abs(w_plus - total / 2.0)
    sums = np.arange(total + 1)
    extreme = counts[np.abs(sums - total / 2.0) >= distance - 1e-9].sum()
    return float(min(1.0, extreme / 2.0 ** n))


def seeds_for_power(mean_diff: float, sd: float, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Seeds a paired test would need to detect ``mean_diff`` at this spread; None when undefined (no difference
    or no spread measured)."""
    if not (math.isfinite(mean_diff) and math.isfinite(sd)) or sd <= 0.0 or abs(mean_diff) <= 1e-12 * sd:
        return None  # no difference (a mean at rounding level of the spread is none) or no spread measured
    z_alpha = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    z_power = NormalDist().inv_cdf(power)
    effect = abs(mean_diff) / sd
    return max(2, math.ceil(((z_alpha + z_power) / effect) ** 2 + z_alpha ** 2 / 2.0))


def holm(p_values) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (in their order): the k-th smallest becomes
    max over j <= k of min(1, (m - j + 1) p_(j)); an adjusted value below ``alpha`` keeps the family-wise error
    rate at ``alpha``."""
    values = [float(p) for p in p_values]
    order = sorted(range(len(values)), key=values.__getitem__)
    adjusted, running = [0.0] * len(values), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(values) - rank) * values[index]))
        adjusted[index] = running
    return adjusted


@dataclass(frozen=True)
class PairedComparison:
    n_seeds: int
    mean_diff: float
    sd: float
    ci_low: float
    ci_high: float
    p_value: float
    seeds_positive: int
    seeds_for_80pct_power: int | None

    @property
    def significant(self) -> bool:
        """At the 5% level by the signed-rank test (the bootstrap interval is the size, not the test)."""
        return self.p_value < 0.05


def compare(diffs, seed: int = 0) -> PairedComparison:
    values = [float(d) for d in diffs]
    if not values:
        raise ValueError("compare needs at least one paired difference")
    mean = float(np.mean(values))
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    low, high = bootstrap_ci(values, seed=seed)
    return PairedComparison(
        n_seeds=len(values), mean_diff=mean, sd=sd, ci_low=low, ci_high=high,
        p_value=wilcoxon_signed_rank_p(values), seeds_positive=sum(v > 0 for v in values),
        seeds_for_80pct_power=seeds_for_power(mean, sd),
    )
