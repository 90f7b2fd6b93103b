"""Paired means: cluster-robust t intervals, the bootstrap, Hall's skewness correction, sample sizes."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy import special, stats

from kvqual.stats.core import Interval, MeanDiff, t_ppf


def _as_clusters(clusters: ArrayLike | None, n: int) -> np.ndarray:
    """Integer cluster codes; every unit its own cluster when None."""
    if clusters is None:
        return np.arange(n)
    g = np.asarray(clusters)
    if g.shape != (n,):
        raise ValueError(f"clusters must have shape ({n},), got {g.shape}")
    return np.unique(g, return_inverse=True)[1]


def mean_ci(values: ArrayLike, clusters: ArrayLike | None = None, level: float = 0.95) -> MeanDiff:
    """Mean with SE = sqrt(Var/n), or cluster-robust (CR1) SE from cluster sums; t on G−1 df."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n < 2:
        raise ValueError("need at least 2 values")
    g = _as_clusters(clusters, n)
    n_g = int(g.max()) + 1
    mean = float(x.mean())
    if n_g < 2:
        raise ValueError("need at least 2 clusters")
    sums = np.bincount(g, weights=x - mean, minlength=n_g)
    se = math.sqrt(n_g / (n_g - 1) * float(np.sum(sums**2)) / n**2)
    df = n_g - 1
    half = t_ppf(0.5 + level / 2, df) * se
    return MeanDiff(mean, se, df, mean - half, mean + half, level, n, n_g)


def paired_mean_diff(
    base: ArrayLike, cand: ArrayLike, clusters: ArrayLike | None = None, level: float = 0.95
) -> MeanDiff:
    """Mean of cand − base per unit with a t CI (cluster-robust when clusters are given)."""
    x, y = np.asarray(base, dtype=float), np.asarray(cand, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"paired arrays differ in shape: {x.shape} vs {y.shape}")
    return mean_ci(y - x, clusters, level)


def paired_bootstrap_ci(
    diffs: ArrayLike,
    rng: np.random.Generator,
    clusters: ArrayLike | None = None,
    level: float = 0.95,
    method: Literal["BCa", "percentile"] = "BCa",
    n_resamples: int = 2000,
) -> Interval:
    """Bootstrap CI of the mean paired difference; resamples whole clusters when given."""
    d = np.asarray(diffs, dtype=float)
    g = _as_clusters(clusters, d.size)
    sums = np.bincount(g, weights=d)
    sizes = np.bincount(g).astype(float)

    def ratio(s: np.ndarray, m: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.sum(s, axis=axis) / np.sum(m, axis=axis)

    res = stats.bootstrap(
        (sums, sizes), ratio, paired=True, vectorized=True, confidence_level=level,
        method=method, n_resamples=n_resamples, rng=rng,
    )
    ci = res.confidence_interval
    return Interval(float(d.mean()), float(ci.low), float(ci.high), level)


def hall_transform(t: float, skew: float, n: int) -> float:
    """Hall's (1992) skewness-corrected studentized mean: g(T) = T + aT² + a²T³/3 + a/2 with
    a = γ/(3√n), γ the sample skewness. g(T) is ≈ N(0, 1) to second order for skewed data where
    T itself is not (a right-skewed mean's upper t bound under-covers). Monotone increasing in T."""
    a = skew / (3 * math.sqrt(n))
    if not math.isfinite(t):
        return t
    return t + a * t * t + a * a * t**3 / 3 + a / 2


def hall_inverse(x: float, skew: float, n: int) -> float:
    """The T with g(T) = x: ((3a(x − a/2) + 1)^(1/3) − 1)/a (T = x when a = 0)."""
    a = skew / (3 * math.sqrt(n))
    if a == 0 or not math.isfinite(x):
        return x
    return (float(np.cbrt(3 * a * (x - a / 2) + 1)) - 1) / a


def _skewness_of_codes(x: np.ndarray, g: np.ndarray) -> float:
    """`cluster_skewness` on integer cluster codes 0..G−1."""
    means = np.bincount(g, weights=x) / np.bincount(g)
    n = means.size
    if n < 3:
        return 0.0
    dev = means - means.mean()
    m2 = float(np.mean(dev * dev))
    if m2 == 0.0 or m2 <= (np.finfo(float).resolution * float(means.mean())) ** 2:
        return 0.0  # no spread, or none that a double can tell from rounding
    m3 = float(np.mean(dev * dev * dev))
    return math.sqrt(n * (n - 1)) / (n - 2) * m3 / m2**1.5


def cluster_skewness(values: ArrayLike, clusters: ArrayLike | None = None) -> float:
    """Sample skewness of the cluster means (of the values when every unit is its own cluster),
    bias-corrected (G1, as `scipy.stats.skew(bias=False)`); 0 for fewer than 3 clusters or no
    spread."""
    x = np.asarray(values, dtype=float)
    return _skewness_of_codes(x, _as_clusters(clusters, x.size))


def sample_size(var_d: float, distance: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """Units needed for a one-sided test to show a bound `distance` away: (z_α+z_β)²·Var(d)/δ²."""
    if distance <= 0:
        raise ValueError("distance to the bound must be positive")
    zz = float(special.ndtri(1 - alpha) + special.ndtri(power))
    return int(math.ceil(zz**2 * var_d / distance**2))


def n_more_to_decide(
    estimate: float, sd: float, n: int, bound: float, alpha: float = 0.05, power: float = 0.5
) -> int | None:
    """Extra units for the one-sided CI to clear `bound` if estimate and SD hold (None: never)."""
    distance = abs(estimate - bound)
    if distance == 0 or not math.isfinite(distance):
        return None
    return max(0, sample_size(sd**2, distance, alpha, power) - n)
