"""Output lengths: ratio of means, Wilcoxon, Hodges–Lehmann, Kolmogorov–Smirnov."""

from __future__ import annotations

import math
import warnings

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from kvqual.stats.core import Interval, TestResult, _z, t_ppf
from kvqual.stats.means import mean_ci


def ratio_of_means_ci(
    base: ArrayLike, cand: ArrayLike, clusters: ArrayLike | None = None, level: float = 0.95
) -> tuple[Interval, float]:
    """mean(cand)/mean(base) with a delta-method CI on the log scale; returns (CI, SE of log).

    Zero lengths are fine (a ratio of means, not a mean of ratios); an all-zero arm is not.
    """
    x, y = np.asarray(base, dtype=float), np.asarray(cand, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired arrays differ in shape: {x.shape} vs {y.shape}")
    mx, my = x.mean(), y.mean()
    if mx <= 0 or my <= 0:
        raise ValueError("ratio of means needs a positive mean in both arms")
    influence = y / my - x / mx  # linearisation of log(my/mx); mean exactly 0
    m = mean_ci(influence, clusters, level)
    log_r = math.log(my / mx)
    half = t_ppf(0.5 + level / 2, m.df) * m.se
    return Interval(my / mx, math.exp(log_r - half), math.exp(log_r + half), level), m.se


def wilcoxon_signed_rank(base: ArrayLike, cand: ArrayLike) -> TestResult:
    """Two-sided Wilcoxon signed-rank test of cand − base (zero differences dropped)."""
    d = np.asarray(cand, dtype=float) - np.asarray(base, dtype=float)
    if not np.any(d != 0):
        return TestResult(0.0, 1.0)
    res = stats.wilcoxon(d, zero_method="wilcox")
    return TestResult(float(res.statistic), float(res.pvalue))


def _kth_walsh(xs: np.ndarray, k: int) -> float:
    """k-th smallest (1-based) Walsh average (x_i+x_j)/2, i≤j, of sorted xs in O(n log n · 64)."""
    n = xs.size
    idx = np.arange(n)

    def count_le(v: float) -> int:
        ends = np.searchsorted(xs, 2 * v - xs, side="right")
        return int(np.maximum(ends - idx, 0).sum())

    lo, hi = float(xs[0]) - 1.0, float(xs[-1])
    for _ in range(200):
        mid = (lo + hi) / 2
        if mid <= lo or mid >= hi:
            break
        if count_le(mid) >= k:
            hi = mid
        else:
            lo = mid
    # snap: the smallest Walsh average above lo
    j = np.maximum(np.searchsorted(xs, 2 * lo - xs, side="right"), idx)
    ok = j < n
    return float(np.min((xs[ok] + xs[j[ok]]) / 2))


_ALL_WALSH_UP_TO = 1500  # n(n+1)/2 Walsh averages (1.1 M at 1,500) are cheaper to partition than to bisect


def _kth_walsh_all(xs: np.ndarray, ks: list[int]) -> list[float]:
    """The k-th smallest (1-based) Walsh averages for each k, from all of them at once."""
    i, j = np.triu_indices(xs.size)
    walsh = (xs[i] + xs[j]) / 2
    walsh.partition([k - 1 for k in ks])
    return [float(walsh[k - 1]) for k in ks]


def hodges_lehmann(diffs: ArrayLike, level: float = 0.95) -> Interval:
    """Hodges–Lehmann shift (median of Walsh averages) with the signed-rank CI (normal approx)."""
    xs = np.sort(np.asarray(diffs, dtype=float))
    n = xs.size
    if n < 2:
        raise ValueError("need at least 2 differences")
    m = n * (n + 1) // 2
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    k = max(1, int(math.floor(m / 2 - _z(level) * sd)))
    ks = [(m + 1) // 2, m // 2 + 1, k, m + 1 - k]
    mid_a, mid_b, low, high = (_kth_walsh_all(xs, ks) if n <= _ALL_WALSH_UP_TO
                               else [_kth_walsh(xs, q) for q in ks])
    return Interval((mid_a + mid_b) / 2, low, high, level)


def ks_two_sample(base: ArrayLike, cand: ArrayLike) -> TestResult:
    """Two-sample Kolmogorov–Smirnov test of the two length distributions."""
    with warnings.catch_warnings():  # ties make the exact method fall back to asymptotic
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.ks_2samp(np.asarray(base, dtype=float), np.asarray(cand, dtype=float))
    return TestResult(float(res.statistic), float(res.pvalue))


def ks_gap(base: ArrayLike, cand: ArrayLike, clusters: ArrayLike | None = None) -> tuple[float, float, float]:
    """Two-sample KS distance D = sup_t |F_cand(t) − F_base(t)| of paired samples, with its SE by the
    delta method at the maximiser: at t*, the gap is the mean over units of
    z = 1[base ≤ t*] − 1[cand ≤ t*], whose (cluster-robust) SE is the SE of D when t* is unique.
    Returns (D, SE, t*); the SE is 0 when every z is the same (e.g. identical arms). ValueError when
    the z vary within fewer than 2 clusters (no SE)."""
    x, y = np.asarray(base, dtype=float), np.asarray(cand, dtype=float)
    if x.shape != y.shape or x.size < 2:
        raise ValueError("ks_gap needs two paired arrays of at least 2 values")
    grid = np.unique(np.concatenate([x, y]))
    gap = (np.searchsorted(np.sort(x), grid, side="right") - np.searchsorted(np.sort(y), grid, side="right"))
    i = int(np.argmax(np.abs(gap)))
    t_star = float(grid[i])
    z = (x <= t_star).astype(float) - (y <= t_star).astype(float)
    d = abs(float(z.mean()))
    if np.all(z == z[0]):
        return d, 0.0, t_star
    return d, mean_ci(z, clusters).se, t_star  # raises with fewer than 2 clusters, as mean_ci does
