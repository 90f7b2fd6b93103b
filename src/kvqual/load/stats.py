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
  one ratio that the interval inverts (the compare's `speedup` criterion from a load.json). Both,
  and `Estimate`, live in kvqual/stats.py with the gate's other statistics; imported here.
- `time_weighted_mean`: a gauge scraped now and then, held until the next scrape, averaged over
  a window.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from numpy.typing import ArrayLike

from kvqual.stats import Estimate, fieller_ratio_ci, fieller_t, mean_ci  # Fieller: pure, beside the gate's

__all__ = ["Estimate", "tokens_in_window", "warmup_seconds", "batch_count", "batch_rates", "batch_means_ci",
           "fieller_ratio_ci", "fieller_t", "lag1_autocorrelation", "time_weighted_mean", "counter_rate", "percentiles",
           "MAX_BATCHES", "WARMUP_LIFETIMES", "WARMUP_SHARE"]

WARMUP_LIFETIMES = 2.0  # the warm-up lasts at least this many median generation times ...
WARMUP_SHARE = 0.10  # ... and at least this share of the run
MAX_BATCHES = 10  # batch means: at most this many batches, each at least one median generation time long


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
