"""Group-sequential looks: the nominal level that keeps error rates at α over K looks.

A sequential compare judges after each of K planned rounds (equal shares of the item
budget). Looking K times at a test run at level α would raise its error rate; instead each
look tests at the **Pocock nominal level** α′(α, K): the constant boundary c with
P(max_k Z_k ≥ c) = α for the standardized partial sums of a Brownian motion observed at
information times t_k = k/K (Corr(Z_i, Z_j) = √(t_i/t_j)), α′ = 1 − Φ(c). So a criterion
whose truth sits on its bound crosses it at some look with probability α, however many of
the K looks are taken. Stopping early (budget, decided verdict) only spends less.

The probability is computed by the Armitage–McPherson–Rowe recursion: the density of the
partial sum S_k on a grid, truncated at the continuation region S_k < c·√t_k, convolved with
the next increment's normal density. Deterministic; checked against Pocock's published
constants (tests/gate/test_sequential.py). Why Pocock and not O'Brien–Fleming: most
criteria here (token level) are decided at the first looks, where OBF would spend almost
nothing; Pocock spends evenly, which suits a gate that should stop early. docs/statistics.md.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

GRID_STEP = 0.02
GRID_LOW = -8.0


def _grid(low: float, high: float) -> tuple[np.ndarray, np.ndarray]:
    """Points from low to high (both included, so the truncation edge is exact) and trapezoid weights."""
    n = max(3, int(math.ceil((high - low) / GRID_STEP)) + 1)
    x = np.linspace(low, high, n)
    w = np.full(n, x[1] - x[0])
    w[[0, -1]] /= 2
    return x, w


def _no_crossing(c: float, looks: int) -> float:
    """P(Z_k < c for every k = 1..looks), equally spaced information times."""
    dt = 1.0 / looks
    sd = math.sqrt(dt)
    grid, w = _grid(GRID_LOW * sd, c * sd)
    dens = np.exp(-0.5 * (grid / sd) ** 2) / (sd * math.sqrt(2 * math.pi))  # S_1 ~ N(0, dt), S_1 < c·√t_1
    for k in range(2, looks + 1):
        nxt, w_next = _grid(GRID_LOW * math.sqrt(k * dt), c * math.sqrt(k * dt))
        kernel = np.exp(-0.5 * ((nxt[:, None] - grid[None, :]) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
        dens = kernel @ (dens * w)
        grid, w = nxt, w_next
    return float(np.sum(dens * w))


@lru_cache(maxsize=256)
def pocock_critical(alpha: float, looks: int) -> float:
    """The constant z boundary for a one-sided level-α test looked at `looks` times."""
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    if looks < 1:
        raise ValueError("looks must be at least 1")
    z1 = float(stats.norm.isf(alpha))
    if looks == 1:
        return z1
    return float(optimize.brentq(lambda c: (1 - _no_crossing(c, looks)) - alpha, z1, z1 + 2.5, xtol=1e-6))


@lru_cache(maxsize=256)
def nominal_alpha(alpha: float, looks: int) -> float:
    """The level each look tests at so that `looks` looks together keep level α."""
    return alpha if looks <= 1 else float(stats.norm.sf(pocock_critical(alpha, looks)))


def look_sizes(pool: int, looks: int) -> list[int]:
    """Items judged at each look: equal shares of the pool, the last look all of it."""
    if pool < 1:
        return []
    looks = max(1, min(looks, pool))
    return sorted({max(1, math.ceil(pool * k / looks)) for k in range(1, looks + 1)})
