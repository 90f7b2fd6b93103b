"""The values kvqual.stats returns (intervals, paired tables, test results) and the normal and t
distribution functions the gate calls thousands of times per compare."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import special


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
