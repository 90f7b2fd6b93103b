"""Group-sequential looks: the nominal level that keeps error rates at α over K looks.

A sequential compare judges after each of K planned rounds, on a geometric schedule (124,
248, 496, ... items: `look_sizes`). Looking K times at a test run at level α would raise its error rate; instead each
look tests at the **Pocock nominal level** α′(α, K): the constant boundary c with
P(max_k Z_k ≥ c) = α for the standardized partial sums of a Brownian motion observed at
information times t_k = n_k/n_K (Corr(Z_i, Z_j) = √(t_i/t_j)), α′ = 1 − Φ(c). So a criterion
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


def _no_crossing(c: float, times: tuple[float, ...]) -> float:
    """P(Z_k < c for every k) for the standardized partial sums of a Brownian motion observed at
    information times `times` (increasing, the last 1): S_k = Z_k·√t_k, independent increments of
    variance t_k − t_(k−1)."""
    sd0 = math.sqrt(times[0])
    grid, w = _grid(GRID_LOW * sd0, c * sd0)
    dens = np.exp(-0.5 * (grid / sd0) ** 2) / (sd0 * math.sqrt(2 * math.pi))  # S_1 ~ N(0, t_1), S_1 < c·√t_1
    for prev, t in zip(times, times[1:]):
        sd = math.sqrt(t - prev)
        nxt, w_next = _grid(GRID_LOW * math.sqrt(t), c * math.sqrt(t))
        kernel = np.exp(-0.5 * ((nxt[:, None] - grid[None, :]) / sd) ** 2) / (sd * math.sqrt(2 * math.pi))
        dens = kernel @ (dens * w)
        grid, w = nxt, w_next
    return float(np.sum(dens * w))


def information_times(looks: int | tuple[int, ...]) -> tuple[float, ...]:
    """The looks' information fractions: `looks` equally spaced ones for a number, else the planned
    sizes (items judged at each look) over the last."""
    if isinstance(looks, int):
        if looks < 1:
            raise ValueError("looks must be at least 1")
        return tuple(k / looks for k in range(1, looks + 1))
    sizes = tuple(int(n) for n in looks)
    if not sizes or any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] < 1:
        raise ValueError(f"planned look sizes must be positive and increasing, got {sizes}")
    return tuple(n / sizes[-1] for n in sizes)


@lru_cache(maxsize=256)
def pocock_critical(alpha: float, looks: int | tuple[int, ...]) -> float:
    """The constant z boundary for a one-sided level-α test looked at `looks` times (a number of
    equally spaced looks, or the planned sizes of each look)."""
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    times = information_times(looks)
    z1 = float(stats.norm.isf(alpha))
    if len(times) == 1:
        return z1
    return float(optimize.brentq(lambda c: (1 - _no_crossing(c, times)) - alpha, z1, z1 + 2.5, xtol=1e-6))


@lru_cache(maxsize=256)
def nominal_alpha(alpha: float, looks: int | tuple[int, ...]) -> float:
    """The level each look tests at so that the planned looks together keep level α."""
    if len(information_times(looks)) == 1:
        return alpha
    return float(stats.norm.sf(pocock_critical(alpha, looks)))


FIRST_LOOK = 124  # items judged at the first look (GatePolicy.first_look): what the 2-core CPU default answers in ~4 min


def look_sizes(pool: int, looks: int, first: int = FIRST_LOOK) -> list[int]:
    """Items judged at each look, on a geometric schedule: `first` items, then twice as many at
    each look, the last look the whole pool, at most `looks` looks (when the pool is more than
    first·2^(looks−1), the ratio grows so that the last look still takes the pool). A last step
    of less than a quarter more items is merged into the look before it. One look (fixed-n): the pool."""
    if pool < 1:
        return []
    if looks <= 1 or pool <= first:
        return [pool]
    ratio = max(2.0, (pool / first) ** (1 / (looks - 1)))
    sizes: list[int] = []
    n = float(first)
    while n < pool and len(sizes) < looks - 1:
        sizes.append(int(round(n)))
        n *= ratio
    if sizes and pool < 1.25 * sizes[-1]:
        sizes.pop()
    return sizes + [pool]
