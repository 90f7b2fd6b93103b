"""The ratio of two independent means (Fieller's interval and statistic)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats


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
