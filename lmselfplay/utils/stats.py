"""Statistics shared by training and evaluation: Wilson intervals for rates, the unbiased
pass@k estimator, normal intervals of a mean."""

from __future__ import annotations

import math


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a proportion; (0, 1) for n = 0. It always holds the observed
    rate: at k = n (or 0) the formula's bound lands a rounding error inside it, so the bounds
    are clamped to the rate (a plot's error bar would otherwise be negative)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (min(p, max(0.0, center - half)), max(p, min(1.0, center + half)))



def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from ``n`` samples of which ``c`` are correct
    (Chen et al. 2021, HumanEval): ``1 - C(n-c, k) / C(n, k)``, as a stable product."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_ci(values: list[float], z: float = 1.96) -> tuple[float, float]:
    """95% interval of a mean of per-problem scores in [0, 1]: Wilson when every score
    is 0 or 1 (a binomial), else the normal interval mean +- z * s / sqrt(n), clipped."""
    n = len(values)
    if n == 0:
        return (0.0, 1.0)
    if all(v in (0, 1) for v in values):
        return wilson(sum(values), n, z)
    m = sum(values) / n
    if n == 1:
        return (0.0, 1.0)
    var = sum((v - m) ** 2 for v in values) / (n - 1)
    half = z * math.sqrt(var / n)
    return (max(0.0, m - half), min(1.0, m + half))
