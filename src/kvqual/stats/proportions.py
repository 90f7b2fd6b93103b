"""Paired proportions (McNemar, Tango and Newcombe CIs, the stratified score test, non-inferiority),
Holm, and single-proportion CIs."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, special, stats

from kvqual.stats.core import Interval, NonInferiority, PairedCounts, _z, norm_sf


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
