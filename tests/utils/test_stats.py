"""pass@k estimator and confidence intervals against known values."""

import math
import random

import pytest

from lmselfplay.utils.stats import mean_ci, pass_at_k, wilson


@pytest.mark.parametrize("n, c, k, want", [
    (10, 3, 1, 0.3),
    (5, 0, 3, 0.0),
    (5, 5, 5, 1.0),
    (10, 2, 5, 1 - 56 / 252),  # 1 - C(8,5)/C(10,5)
    (200, 1, 100, 0.5),
    (4, 2, 3, 1.0),  # n - c < k: some draw of 3 always holds a correct one
])
def test_pass_at_k_known_counts(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)


def test_pass_at_k_equals_combinatorial_definition():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_is_unbiased_by_simulation():
    # pass@k of a problem with true success rate p is 1 - (1-p)^k; the estimator's
    # average over many n-sample draws must match it
    rng = random.Random(0)
    p, n, k = 0.2, 10, 4
    est = [pass_at_k(n, sum(rng.random() < p for _ in range(n)), k) for _ in range(20000)]
    assert sum(est) / len(est) == pytest.approx(1 - (1 - p) ** k, abs=0.01)


@pytest.mark.parametrize("bad", [(5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)])
def test_pass_at_k_rejects_impossible_counts(bad):
    with pytest.raises(ValueError):
        pass_at_k(*bad)


def test_wilson_known_values():
    # published values of the Wilson score interval (z = 1.96)
    assert wilson(50, 100) == pytest.approx((0.4038, 0.5962), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)


def test_wilson_interval_holds_the_observed_rate():
    # at k = n the formula's upper bound can land a rounding error below 1 (n = 6, 11, ...),
    # which made the referee study's error bars negative and its plot fail
    for n in range(1, 300):
        for k in (0, 1, n // 2, n - 1, n):
            lo, hi = wilson(k, n)
            assert 0.0 <= lo <= k / n <= hi <= 1.0, (k, n, lo, hi)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.85])
def test_binomial_interval_covers_95_percent(p):
    rng = random.Random(1)
    n, trials = 60, 4000
    hits = 0
    for _ in range(trials):
        lo, hi = mean_ci([1 if rng.random() < p else 0 for _ in range(n)])
        hits += lo <= p <= hi
    assert 0.93 <= hits / trials <= 0.975


def test_mean_ci_fractional_scores_is_the_normal_interval():
    vals = [0.2, 0.4, 0.6, 0.8]
    m, s = 0.5, math.sqrt(sum((v - 0.5) ** 2 for v in vals) / 3)
    assert mean_ci(vals) == pytest.approx((m - 1.96 * s / 2, m + 1.96 * s / 2))
    assert mean_ci([]) == (0.0, 1.0)
    assert mean_ci([1, 0, 1, 1]) == wilson(3, 4)
