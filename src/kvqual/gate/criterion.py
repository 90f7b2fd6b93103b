"""What every criterion is made of: the `Criterion` value, and the t/normal pieces its tests share
(the one-sided test of an estimate against one bound, n_more, the unit counted: items or contexts).
gate/criteria.py re-exports these names."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvqual import stats as st
from kvqual.gate.inputs import n_clusters

Status = Literal["pass", "fail", "inconclusive", "not_evaluated"]
Direction = Literal["at_least", "at_most", "within"]
Role = Literal["primary", "guard"]


@dataclass(frozen=True)
class Criterion:
    """One judged quantity: estimate, interval, bound, tests and status.

    `role`: a primary criterion must be shown inside its bound for PASS; a guard can only
    FAIL the candidate (shown outside), its being undecided never blocks PASS.
    `n` counts independent units (clusters); `unit` names them ("items" or "contexts").
    """

    name: str
    suite: str | None
    status: Status
    direction: Direction
    bound_low: float | None
    bound_high: float | None
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: float | None = None
    p_pass: float | None = None  # one-sided: H0 outside the bound
    p_fail: float | None = None  # one-sided: H0 inside the bound
    p_fail_holm: float | None = None
    n: int = 0
    n_more: int | None = None
    detail: str = ""
    role: Role = "primary"
    unit: str = "items"
    level: float | None = None  # the one-sided level its tests ran at (α, or α′ at a sequential look)
    infrastructure: bool = False  # undecided because requests failed, not for want of items: exit 4, never more items

    @property
    def label(self) -> str:
        return f"{self.name}[{self.suite}]" if self.suite else self.name


def not_evaluated(name: str, direction: Direction, low: float | None, high: float | None, detail: str,
                  suite: str | None = None, role: Role = "primary") -> Criterion:
    return Criterion(name, suite, "not_evaluated", direction, low, high, detail=detail, role=role)


def _cdf(x: float, df: float) -> float:
    """t (or normal when df is inf) CDF that accepts ±inf."""
    return st.t_cdf(x, df)


def _quantile(level: float, df: float) -> float:
    return st.t_isf(level, df)


def _standardized(diff: float, se: float) -> float:
    if se > 0:
        return diff / se
    return 0.0 if diff == 0 else math.copysign(math.inf, diff)


def _n_more(est: float, sd: float, n: int, bound: float, inside: bool, level: float, m: int) -> int | None:
    """Clusters to decide, inverting the test used: pass side at `level`, fail side at Holm's
    worst level/m; None when the estimate sits on the bound."""
    more = st.n_more_to_decide(est, sd, n, bound, level if inside else level / max(m, 1))
    return None if more is None else max(1, more)  # asked only of undecided criteria: at least one more


CONTEXT_PREFIX = "ctx:"  # cluster ids of shared contexts; items are "item:<suite>\x00<id>" (compare/metrics.py)


def _unit(clusters: np.ndarray | None, n_units: int) -> tuple[int, str]:
    """Independent units and their name: "contexts" when every cluster is a shared context (then more
    *contexts* are what deciding needs), else "items"."""
    g = n_clusters(clusters, n_units)
    if clusters is not None and len(clusters) and all(str(c).startswith(CONTEXT_PREFIX) for c in clusters):
        return g, "contexts"
    return g, "items"


def one_sided(name: str, suite: str | None, direction: Direction, bound: float, est: float, se: float, df: float,
              n: int, level: float, detail: str, m: int, role: Role = "primary", unit: str = "items") -> Criterion:
    """A criterion judged by a t/normal test of est against one bound."""
    zed = _standardized(est - bound, se)
    if direction == "at_most":  # inside is below the bound
        p_pass, p_fail = _cdf(zed, df), 1.0 - _cdf(zed, df)
    else:
        p_pass, p_fail = 1.0 - _cdf(zed, df), _cdf(zed, df)
    q = _quantile(level, df)
    inside = (est > bound) if direction == "at_least" else (est < bound)
    return Criterion(
        name, suite, "inconclusive", direction,
        bound if direction == "at_least" else None, bound if direction == "at_most" else None,
        est, est - q * se, est + q * se, 1 - 2 * level, p_pass, p_fail, None, n,
        _n_more(est, se * math.sqrt(n), n, bound, inside, level, m), detail, role, unit, level,
    )
