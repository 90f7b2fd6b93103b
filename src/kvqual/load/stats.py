"""The statistics of a load run, as pure functions of arrays (no I/O, no clock).

- `tokens_in_window`: how many of each request's output tokens fell inside a time window. A
  streamed request gives its first token's time, its last token's time and its token count; the
  first token is placed at its time and the others evenly between the two (what its mean
  inter-token latency says), so tokens of a request that straddles a window edge are split.
- `warmup_seconds`: the documented warm-up rule (docs/speed.md, "Speed at saturation").
- `batch_means_ci`: the steady window cut into equal batches; the mean of the batch rates with a
  Student t interval on B − 1 degrees of freedom.
- `fieller_ratio_ci`: candidate / baseline of two independent means (the arms run one after the
  other) with Fieller's interval, Welch–Satterthwaite degrees of freedom; `fieller_t` the test of
  one ratio that the interval inverts (the compare's `speedup` criterion from a load.json).
- `time_weighted_mean`: a gauge scraped now and then, held until the next scrape, averaged over
  a window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from kvqual.compare.stats import mean_ci

__all__ = ["Estimate", "tokens_in_window", "warmup_seconds", "batch_count", "batch_rates", "batch_means_ci",
           "fieller_ratio_ci", "fieller_t", "lag1_autocorrelation", "time_weighted_mean", "counter_rate", "percentiles",
           "MAX_BATCHES", "WARMUP_LIFETIMES", "WARMUP_SHARE"]

WARMUP_LIFETIMES = 2.0  # the warm-up lasts at least this many median generation times ...
WARMUP_SHARE = 0.10  # ... and at least this share of the run
MAX_BATCHES = 10  # batch means: at most this many batches, each at least one median generation time long


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


def tokens_in_window(first: ArrayLike, last: ArrayLike, tokens: ArrayLike, a: float, b: float) -> np.ndarray:
    """Per request, the output tokens generated in [a, b): the first at `first`, the other
    `tokens − 1` spread evenly over (first, last]. A request with one token, or whose tokens all
    came at once (last == first), has them all at `first`."""
    f, l, n = (np.asarray(x, dtype=float) for x in (first, last, tokens))
    point = np.where((f >= a) & (f < b), 1.0, 0.0)
    span = l - f
    overlap = np.clip(np.minimum(l, b) - np.maximum(f, a), 0.0, None)
    spread = np.where(span > 0, overlap / np.where(span > 0, span, 1.0), 0.0)
    rest = np.clip(n - 1, 0, None)
    at_once = (span <= 0) & (f >= a) & (f < b)
    return np.where(n > 0, point + rest * np.where(at_once, 1.0, spread), 0.0)


def warmup_seconds(duration_s: float, generation_times: ArrayLike) -> float:
    """The warm-up to discard: max(2 × the median generation time (first to last token) of the
    answered requests, 10 % of the run). In a closed loop every request in flight starts at once;
    after one generation time the first cohort has finished and its replacements start staggered,
    and KV usage (which grows with every running request's output) has reached its level; a
    second one is the margin. The 10 % floor covers what is not the model (connection set-up,
    caches, allocators) on runs whose requests are short."""
    g = np.asarray(generation_times, dtype=float)
    g = g[np.isfinite(g)]
    lifetimes = WARMUP_LIFETIMES * float(np.median(g)) if g.size else 0.0
    return max(lifetimes, WARMUP_SHARE * duration_s)


def batch_count(window_s: float, generation_time_s: float, max_batches: int = MAX_BATCHES) -> int:
    """How many equal batches the steady window is cut into: each at least one median generation
    time long (shorter batches are correlated: the same requests run through neighbours), at most
    `max_batches`; 0 or 1 means there is no interval."""
    if window_s <= 0:
        return 0
    if generation_time_s <= 0:
        return max_batches
    return int(min(max_batches, math.floor(window_s / generation_time_s)))


def batch_rates(first: ArrayLike, last: ArrayLike, tokens: ArrayLike, end: ArrayLike, ok: ArrayLike,
                a: float, b: float, batches: int) -> tuple[np.ndarray, np.ndarray]:
    """(output tokens/s, answered requests/s) in each of `batches` equal batches of [a, b).
    Requests count where they end; tokens where they were generated (`tokens_in_window`)."""
    if batches < 1 or b <= a:
        return np.array([]), np.array([])
    edges = np.linspace(a, b, batches + 1)
    width = (b - a) / batches
    ok_mask = np.asarray(ok, dtype=bool)
    f, l, n = (np.asarray(x, dtype=float)[ok_mask] for x in (first, last, tokens))
    e = np.asarray(end, dtype=float)[ok_mask]
    tok = np.array([tokens_in_window(f, l, n, lo, hi).sum() / width for lo, hi in zip(edges[:-1], edges[1:])])
    req = np.histogram(e, bins=edges)[0] / width if e.size else np.zeros(batches)
    return tok, req.astype(float)


def batch_means_ci(values: ArrayLike, level: float = 0.95) -> Estimate:
    """Mean of batch means ± t_{(1+level)/2, B−1} · s / √B (s: the batch means' sample SD)."""
    x = np.asarray(values, dtype=float)
    n = int(x.size)
    if n == 0:
        return Estimate(math.nan, None, None, level, None, 0)
    if n < 2:
        return Estimate(float(x.mean()), None, None, level, None, n)
    m = mean_ci(x, level=level)  # the project's t interval of a mean (every batch its own unit)
    return Estimate(m.estimate, m.low, m.high, level, float(m.df), n)


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


def lag1_autocorrelation(values: ArrayLike) -> float | None:
    """Lag-1 autocorrelation of the batch means: near 0 when the batches are long enough to be
    independent; well above 0 says the interval is too narrow (run longer)."""
    x = np.asarray(values, dtype=float)
    if x.size < 3:
        return None
    d = x - x.mean()
    denom = float((d * d).sum())
    return float((d[:-1] * d[1:]).sum() / denom) if denom > 0 else None


def time_weighted_mean(times: Sequence[float], values: Sequence[float], a: float, b: float) -> float | None:
    """The mean over [a, b] of a gauge read at `times` (sorted) and held until the next reading.
    Before the first reading it is unknown: the mean covers [max(a, first reading), b]. None when
    nothing was read by `b`."""
    t, v = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    if t.size == 0 or t[0] > b or b <= a:
        return None
    start = max(a, float(t[0]))
    if start >= b:
        return float(v[np.searchsorted(t, b, side="right") - 1])
    edges = np.concatenate(([start], t[(t > start) & (t < b)], [b]))
    held = v[np.searchsorted(t, edges[:-1], side="right") - 1]
    return float((held * np.diff(edges)).sum() / (b - start))


def counter_rate(times: Sequence[float], values: Sequence[float], a: float, b: float) -> float | None:
    """A counter's rate over [a, b]: linear between readings at the window's edges. None when the
    readings do not cover the window, or the counter went down (the server restarted)."""
    t, v = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    if t.size < 2 or t[0] > a or t[-1] < b or b <= a or np.any(np.diff(v) < 0):
        return None
    return float((np.interp(b, t, v) - np.interp(a, t, v)) / (b - a))


def percentiles(values: Sequence[float | None], qs: tuple[int, ...] = (50, 90, 99)) -> dict[str, float | int | None]:
    """`n`, `mean` and `p50`/`p90`/`p99` of the finite values (None when there are none)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    out: dict[str, float | int | None] = {"n": int(x.size), "mean": round(float(x.mean()), 5) if x.size else None}
    for q in qs:
        out[f"p{q}"] = round(float(np.percentile(x, q)), 5) if x.size else None
    return out
