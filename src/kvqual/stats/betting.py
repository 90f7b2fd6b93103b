"""Betting bounds for means of values bounded above (Waudby-Smith & Ramdas)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize

from kvqual.stats.means import _as_clusters


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
    and says what the cap means (gate/criteria.py).

    `running`: one process over the clusters in their given order, its bets sized by the clusters
    so far (λ_g = √(2 log(1/α) / (σ̂²_{g−1} · g · log(1 + g))), Waudby-Smith & Ramdas' anytime
    choice) and never by their number, so the capital after the first G clusters is the same
    whatever follows; the evidence is the highest capital on the path, sup_g K_g(m), which Ville's
    inequality bounds at 1/α under H0 too. Given clusters in a fixed order (the plan's seeded
    order), the looks of a sequential compare see one process: a look may test at α itself, and
    an earlier look's "shown inside" stays valid at every later one."""

    def __init__(self, values: ArrayLike, cap: float, clusters: ArrayLike | None = None,
                 level: float = 0.05, running: bool = False) -> None:
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
        if running:  # sized by the clusters so far only, never by n: the same process at every look
            g = np.arange(1, n + 1)
            self.lam = np.sqrt(2 * math.log(1 / level) / (var * g * np.log1p(g)))
        else:
            self.lam = np.sqrt(2 * math.log(1 / level) / (n * var))
        self.level = level
        self.running = running

    def log_capital(self, m: float) -> float:
        """log K(m): the evidence against a mean of m or more."""
        u = m / self.cap
        if u >= 1:
            return math.inf
        lam = np.minimum(self.lam, BET_TRUNCATION / (1 - u))
        steps = np.log1p(lam * (u - self.y))
        if self.running:  # Ville bounds the whole path: its highest point is the evidence
            return float(max(0.0, np.max(np.cumsum(steps))))
        return float(np.sum(steps))

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
