"""Paired statistics for comparing two serving configs: pure functions on numpy arrays.

Proportions (flips, McNemar, Tango/Newcombe CIs, non-inferiority), paired means with
cluster-robust SEs and bootstrap CIs, output-length comparisons, Holm, single-proportion
CIs, sample sizes. No I/O; randomness only through a passed-in `numpy.random.Generator`.
scipy/statsmodels do the work where they can; formulas and sources: docs/statistics.md.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, special, stats

__all__ = [
    "Interval", "PairedCounts", "MeanDiff", "TestResult", "NonInferiority",
    "paired_counts", "mcnemar_exact_p", "tango_ci", "tango_z", "tango_unit_variance",
    "stratified_score_z", "stratified_score_ci", "newcombe_ci",
    "paired_noninferiority", "mean_ci", "paired_mean_diff", "paired_bootstrap_ci",
    "sample_size", "n_more_to_decide", "hall_transform", "hall_inverse", "cluster_skewness", "ratio_of_means_ci", "wilcoxon_signed_rank",
    "hodges_lehmann", "UpperBet", "ks_two_sample", "ks_gap", "Estimate", "fieller_ratio_ci", "fieller_t", "holm_adjust", "wilson_ci", "clopper_pearson_ci",
]


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval at `level`."""

    estimate: float
    low: float
    high: float
    level: float


@dataclass(frozen=True)
class PairedCounts:
    """A paired 2x2 table: a both right, b base right→cand wrong, c base wrong→cand right, d both wrong."""

    a: int
    b: int
    c: int
    d: int

    @property
    def n(self) -> int:
        return self.a + self.b + self.c + self.d

    @property
    def difference(self) -> float:
        """Accuracy of candidate minus accuracy of baseline: (c − b) / n."""
        return (self.c - self.b) / self.n if self.n else 0.0


@dataclass(frozen=True)
class MeanDiff:
    """Mean of paired differences with its (cluster-robust) SE and t interval."""

    estimate: float
    se: float
    df: int
    low: float
    high: float
    level: float
    n: int
    n_clusters: int


@dataclass(frozen=True)
class TestResult:
    """A test statistic and its p-value."""

    statistic: float
    pvalue: float


@dataclass(frozen=True)
class NonInferiority:
    """One-sided test of H0: cand − base ≤ −margin (Tango score); `lower` is the one-sided bound."""

    estimate: float
    lower: float
    margin: float
    pvalue: float
    alpha: float

    @property
    def noninferior(self) -> bool:
        return self.pvalue < self.alpha


def _z(level: float) -> float:
    """Two-sided normal quantile for a confidence level."""
    return float(special.ndtri(0.5 + level / 2))


# The distribution functions the gate calls thousands of times per compare, straight from the
# scipy.special routines that scipy.stats.norm / scipy.stats.t evaluate (the same values, without
# the frozen-distribution argument checks that cost ~0.2 ms a call).

def norm_cdf(x: float) -> float:
    return float(special.ndtr(x))


def norm_sf(x: float) -> float:
    return float(special.ndtr(-x))


def norm_isf(q: float) -> float:
    return float(-special.ndtri(q))


def t_cdf(x: float, df: float) -> float:
    """Student t CDF (the normal one where df is infinite)."""
    return norm_cdf(x) if math.isinf(df) else float(special.stdtr(df, x))


def t_isf(q: float, df: float) -> float:
    """Upper-tail t quantile (normal where df is infinite)."""
    return norm_isf(q) if math.isinf(df) else float(-special.stdtrit(df, q))


def t_ppf(p: float, df: float) -> float:
    return float(special.ndtri(p)) if math.isinf(df) else float(special.stdtrit(df, p))


# ---------------------------------------------------------------- paired proportions


def paired_counts(base_correct: ArrayLike, cand_correct: ArrayLike) -> PairedCounts:
    """Count the paired 2x2 table from two aligned boolean arrays (one entry per item)."""
    x = np.asarray(base_correct, dtype=bool)
    y = np.asarray(cand_correct, dtype=bool)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired arrays must be 1-D and equal length, got {x.shape} and {y.shape}")
    return PairedCounts(
        a=int(np.sum(x & y)), b=int(np.sum(x & ~y)), c=int(np.sum(~x & y)), d=int(np.sum(~x & ~y))
    )


def mcnemar_exact_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: binomial test of b vs c discordant pairs at 1/2."""
    if b == c:
        return 1.0
    # what scipy.stats.binomtest(b, b + c, 0.5) gives (the two tails are mirror images at 1/2),
    # without its ~1 ms of set-up per call
    return min(1.0, 2.0 * float(special.bdtr(min(b, c), b + c, 0.5)))


def tango_unit_variance(counts: PairedCounts, delta0: float) -> float:
    """Var(cand − base) of one pair under H0: cand − base = delta0, at Tango's (1998) restricted
    maximum-likelihood estimate q of P(base right only): 2q + delta0·(1 − delta0). Cells may be
    fractional (a cluster counted once, its units' shares of each cell)."""
    n, x12, x21 = counts.n, counts.c, counts.b  # x12: cand right only, x21: base right only
    big_a = 2.0 * n
    big_b = -x12 - x21 + (2.0 * n - x12 + x21) * delta0
    big_c = -x21 * delta0 * (1.0 - delta0)
    q21 = (math.sqrt(max(big_b * big_b - 4.0 * big_a * big_c, 0.0)) - big_b) / (2.0 * big_a)
    return 2.0 * q21 + delta0 * (1.0 - delta0)


def tango_z(counts: PairedCounts, delta0: float) -> float:
    """Tango's (1998) score statistic for H0: cand − base = delta0 (positive: cand better)."""
    n, x12, x21 = counts.n, counts.c, counts.b
    var = n * tango_unit_variance(counts, delta0)
    num = x12 - x21 - n * delta0
    if var <= 0.0:
        return 0.0 if num == 0 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def tango_ci(counts: PairedCounts, level: float = 0.95) -> Interval:
    """Tango's score CI for cand − base (inverts `tango_z`; good coverage at small n)."""
    if counts.n == 0:
        raise ValueError("no pairs")
    z, est, eps = _z(level), counts.difference, 1e-12
    lo_end, hi_end = -1.0 + eps, 1.0 - eps
    if tango_z(counts, lo_end) - z <= 0:
        low = -1.0
    else:
        low = optimize.brentq(lambda t: tango_z(counts, t) - z, lo_end, est, xtol=1e-12)
    if tango_z(counts, hi_end) + z >= 0:
        high = 1.0
    else:
        high = optimize.brentq(lambda t: tango_z(counts, t) + z, est, hi_end, xtol=1e-12)
    return Interval(est, float(low), float(high), level)


def stratified_score_z(tables: list[PairedCounts], weights: ArrayLike, delta0: float) -> float:
    """Score statistic for H0: Σ_s w_s·Δ_s = delta0 over strata s (suites) of paired binary outcomes,
    Δ_s = cand − base accuracy in stratum s: (Σ w_s·Δ̂_s − delta0) / √(Σ w_s²·V_s/n_s), each
    stratum's variance V_s taken under the null (`tango_unit_variance` at delta0: the common-
    difference restriction of Miettinen–Nurminen's stratified score test, with Tango's paired
    likelihood). A Wald statistic takes V_s at Δ̂_s instead, which is too small near the margin,
    where most flips go one way: its size exceeds α from a few hundred items
    (docs/calibration.md); under the null the variance is what the margin implies."""
    w = np.asarray(weights, dtype=float)
    num = sum(wi * t.difference for wi, t in zip(w, tables) if t.n) - delta0
    var = sum(wi * wi * tango_unit_variance(t, delta0) / t.n for wi, t in zip(w, tables) if t.n)
    if var <= 0.0:
        return 0.0 if num == 0 else math.copysign(math.inf, num)
    return num / math.sqrt(var)


def stratified_score_ci(tables: list[PairedCounts], weights: ArrayLike, level: float = 0.95) -> Interval:
    """The interval that inverts `stratified_score_z`: every delta0 neither one-sided test rejects."""
    w = np.asarray(weights, dtype=float)
    if not any(t.n for t in tables):
        raise ValueError("no pairs")
    z, eps = _z(level), 1e-12
    est = float(sum(wi * t.difference for wi, t in zip(w, tables) if t.n))
    f = lambda d: stratified_score_z(tables, w, d)  # noqa: E731  decreasing in delta0
    lo_end, hi_end = -1.0 + eps, 1.0 - eps
    low = -1.0 if f(lo_end) - z <= 0 else optimize.brentq(lambda d: f(d) - z, lo_end, est, xtol=1e-12)
    high = 1.0 if f(hi_end) + z >= 0 else optimize.brentq(lambda d: f(d) + z, est, hi_end, xtol=1e-12)
    return Interval(est, float(low), float(high), level)


def _wilson(k: float, n: float, z: float) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def newcombe_ci(counts: PairedCounts, level: float = 0.95) -> Interval:
    """Newcombe's (1998) method 10 CI for cand − base: Wilson limits + corrected phi."""
    n = counts.n
    if n == 0:
        raise ValueError("no pairs")
    z = _z(level)
    k1, k2 = counts.a + counts.c, counts.a + counts.b  # cand right, base right
    p1, p2 = k1 / n, k2 / n
    l1, u1 = _wilson(k1, n, z)
    l2, u2 = _wilson(k2, n, z)
    margins = [k1, n - k1, k2, n - k2]
    if min(margins) == 0:
        phi = 0.0
    else:
        det = counts.a * counts.d - counts.b * counts.c
        adj = det - n / 2 if det > n / 2 else (0.0 if det >= 0 else det)
        phi = adj / math.sqrt(math.prod(float(m) for m in margins))
    est = p1 - p2
    dl = math.sqrt(max((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2, 0.0))
    du = math.sqrt(max((u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2, 0.0))
    return Interval(est, est - dl, est + du, level)


def paired_noninferiority(counts: PairedCounts, margin: float, alpha: float = 0.05) -> NonInferiority:
    """Tango score test of H0: cand − base ≤ −margin; p < alpha ⇔ one-sided lower bound > −margin."""
    zs = tango_z(counts, -margin)
    lower = tango_ci(counts, level=1 - 2 * alpha).low
    return NonInferiority(counts.difference, lower, margin, norm_sf(zs), alpha)


# ---------------------------------------------------------------- paired means


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


# ---------------------------------------------------------------- betting bounds (bounded above)


BET_TRUNCATION = 0.75  # a bet risks at most this share of the capital (Waudby-Smith & Ramdas' c = 3/4)


class UpperBet:
    """One-sided test by betting of H0: mean ≥ m, for per-unit values x ≤ `cap` (no lower limit),
    and the upper confidence bound that inverts it (Waudby-Smith & Ramdas 2024, "Estimating means
    of bounded random variables by betting", JRSS B 86(1): the hedged capital's lower-side process
    with predictable plug-in bets, here on values bounded above only).

    The capital K(m) = Π_g (1 + λ_g · (m − x̄_g)/cap) over clusters g in their given order (x̄_g a
    cluster's mean: the mean tested is the mean over clusters, each independent unit weighing the
    same); each bet λ_g is fixed from the clusters before g (a mean and variance of the values
    so far, started at ½ and ¼ on the unit scale), at most BET_TRUNCATION/(1 − m/cap), so every
    factor stays positive. Under H0 K is a nonnegative supermartingale with K₀ = 1, so by Ville's
    inequality P(K(m) ≥ 1/α) ≤ α whatever the values' distribution, however skewed, at any n:
    the p-value is min(1, 1/K(m)) and the bound U = inf{m : K(m) ≥ 1/α} covers the mean with
    probability ≥ 1 − α. Near-degenerate samples (all values 0 but a few) give a finite bound,
    ≈ cap·log(1/α)/(c·G) when nothing varies, and a spread-out sample one close to the t bound
    as G grows. What it needs is the cap: a mean of values unbounded above has no finite-sample
    upper bound at all (a rare huge value can carry it), so a criterion caps its values first
    and says what the cap means (gate/criteria.py)."""

    def __init__(self, values: ArrayLike, cap: float, clusters: ArrayLike | None = None,
                 level: float = 0.05) -> None:
        x = np.asarray(values, dtype=float)
        if x.size == 0:
            raise ValueError("no values")
        if not cap > 0 or not math.isfinite(cap):
            raise ValueError("cap must be positive and finite")
        if np.any(x > cap * (1 + 1e-12)):
            raise ValueError("values above the cap: cap them first")
        codes = _as_clusters(clusters, x.size)
        # clusters in order of first appearance (the units' order is the plan's seeded order)
        first = np.full(int(codes.max()) + 1, x.size)
        np.minimum.at(first, codes, np.arange(x.size))
        rank = np.empty_like(first)
        rank[np.argsort(first, kind="stable")] = np.arange(first.size)
        g = rank[codes]
        self.cap = float(cap)
        self.y = np.minimum(np.bincount(g, weights=x) / np.bincount(g) / cap, 1.0)  # cluster means on the unit scale
        self.mean = float(self.y.mean() * cap)
        n = self.y.size
        # predictable plug-in: the running mean and variance of the clusters before each one
        mu_after = (0.5 + np.cumsum(self.y)) / np.arange(2, n + 2)
        dev = np.concatenate([[0.0], np.cumsum((self.y - mu_after) ** 2)[:-1]])
        var = (0.25 + dev) / np.arange(1, n + 1)
        self.lam = np.sqrt(2 * math.log(1 / level) / (n * var))
        self.level = level

    def log_capital(self, m: float) -> float:
        """log K(m): the evidence against a mean of m or more."""
        u = m / self.cap
        if u >= 1:
            return math.inf
        lam = np.minimum(self.lam, BET_TRUNCATION / (1 - u))
        return float(np.sum(np.log1p(lam * (u - self.y))))

    def p_value(self, m: float) -> float:
        """One-sided p-value of H0: mean ≥ m (Ville: min(1, 1/K))."""
        return float(min(1.0, math.exp(-self.log_capital(m)))) if m < self.cap else 0.0

    def upper(self) -> float:
        """The smallest m at which H0: mean ≥ m is rejected at the level the bets were sized for
        (the cap when none below it is)."""
        target = math.log(1 / self.level)
        low = self.mean
        if self.log_capital(low) >= target:
            return low
        high = self.cap * (1 - 1e-9)
        if self.log_capital(high) < target:
            return self.cap
        return float(optimize.brentq(lambda m: self.log_capital(m) - target, low, high,
                                     xtol=self.cap * 1e-9, rtol=1e-10))


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


# ---------------------------------------------------------------- output length


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


# ---------------------------------------------------------------- ratio of two independent means (Fieller)


@dataclass(frozen=True)
class Estimate:
    """A mean with its two-sided t interval at `level`; `low`/`high` None when it has none
    (fewer than two batches, or a ratio whose denominator is not shown to be above zero)."""

    estimate: float
    low: float | None
    high: float | None
    level: float
    df: float | None
    n: int

    def to_json(self, digits: int = 4) -> dict[str, float | int | None]:
        r = lambda x: None if x is None or not math.isfinite(x) else round(x, digits)  # noqa: E731
        return {"estimate": r(self.estimate), "low": r(self.low), "high": r(self.high), "level": self.level,
                "df": r(self.df), "n": self.n}


def fieller_ratio_ci(baseline: ArrayLike, candidate: ArrayLike, level: float = 0.95) -> Estimate:
    """mean(candidate) / mean(baseline) for independent samples (batch means of two arms) with
    Fieller's interval: the R with (ȳ − R·x̄)² ≤ t² (v_y + R² v_x), v the variances of the means,
    t on Welch–Satterthwaite degrees of freedom of ȳ − R̂·x̄. Unlike the delta method it is
    exact under normality and asymmetric, as a ratio's uncertainty is; when x̄ is not shown to be
    above zero (x̄² ≤ t² v_x) the set is unbounded and `low`/`high` are None."""
    x, y = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    nx, ny = int(x.size), int(y.size)
    if nx == 0 or ny == 0 or x.mean() == 0:
        return Estimate(math.nan, None, None, level, None, min(nx, ny))
    mx, my = float(x.mean()), float(y.mean())
    ratio = my / mx
    if nx < 2 or ny < 2:
        return Estimate(ratio, None, None, level, None, min(nx, ny))
    vx, vy, df = _fieller_moments(x, y, ratio)
    if df is None:  # both arms perfectly steady: the ratio is known
        return Estimate(ratio, ratio, ratio, level, None, min(nx, ny))
    t = float(stats.t.ppf((1 + level) / 2, df))
    a = mx**2 - t**2 * vx  # R² a − 2 R x̄ȳ + (ȳ² − t² v_y) ≤ 0
    if a <= 0:
        return Estimate(ratio, None, None, level, df, min(nx, ny))
    disc = t**2 * (mx**2 * vy + my**2 * vx - t**2 * vx * vy)
    root = math.sqrt(max(disc, 0.0))
    return Estimate(ratio, (mx * my - root) / a, (mx * my + root) / a, level, df, min(nx, ny))


def _fieller_moments(x: np.ndarray, y: np.ndarray, ratio: float) -> tuple[float, float, float | None]:
    """v_x, v_y (the variances of the two means) and the Welch–Satterthwaite degrees of freedom of
    ȳ − R̂·x̄ at the estimate R̂; df None when both arms are perfectly steady (no variance)."""
    nx, ny = int(x.size), int(y.size)
    vx, vy = float(x.var(ddof=1)) / nx, float(y.var(ddof=1)) / ny
    var = vy + ratio**2 * vx
    if var == 0:
        return vx, vy, None
    return vx, vy, var**2 / (vy**2 / (ny - 1) + (ratio**2 * vx) ** 2 / (nx - 1))


def fieller_t(baseline: ArrayLike, candidate: ArrayLike, r0: float) -> tuple[float, float | None]:
    """Fieller's statistic for the ratio mean(candidate) / mean(baseline) = r0, and its degrees of
    freedom: T = (ȳ − r0·x̄) / √(v_y + r0²·v_x) on the df `fieller_ratio_ci` uses (Welch–Satterthwaite
    at the estimate). It is the test that interval inverts: with positive means, r0 is below the
    interval's lower bound at level 1 − 2q exactly when T > t_{1−q}(df), above its upper bound
    exactly when T < −t_{1−q}(df). Needs at least two values in each arm; T is ±inf (df None)
    when neither arm varies."""
    x, y = np.asarray(baseline, dtype=float), np.asarray(candidate, dtype=float)
    if x.size < 2 or y.size < 2 or x.mean() == 0:
        raise ValueError("fieller_t needs two values in each arm and a baseline mean other than 0")
    mx, my = float(x.mean()), float(y.mean())
    vx, vy, df = _fieller_moments(x, y, my / mx)
    diff, var = my - r0 * mx, vy + r0**2 * vx
    if var == 0:
        return (0.0 if diff == 0 else math.copysign(math.inf, diff)), df
    return diff / math.sqrt(var), df


# ---------------------------------------------------------------- multiplicity, rates


def holm_adjust(pvalues: ArrayLike) -> np.ndarray:
    """Holm–Bonferroni step-down adjusted p-values (same order as given, capped at 1)."""
    p = np.asarray(pvalues, dtype=float)
    m = p.size
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    stepped = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out = np.empty(m)
    out[order] = np.minimum(stepped, 1.0)
    return out


def wilson_ci(k: int, n: int, level: float = 0.95) -> Interval:
    """Wilson score interval for a single proportion k/n."""
    if n <= 0:
        raise ValueError("n must be positive")
    low, high = _wilson(k, n, _z(level))
    return Interval(k / n, max(low, 0.0), min(high, 1.0), level)


def clopper_pearson_ci(k: int, n: int, level: float = 0.95) -> Interval:
    """Exact (Clopper–Pearson) interval for a single proportion k/n."""
    if n <= 0:
        raise ValueError("n must be positive")
    a = 1 - level
    low = 0.0 if k == 0 else float(stats.beta.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(stats.beta.ppf(1 - a / 2, k + 1, n - k))
    return Interval(k / n, low, high, level)
