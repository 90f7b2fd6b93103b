"""The forest plot of the decision: one row per criterion, its interval against its bound on its
own scale and in its own units, laid out as positions in percent that report.html's template
draws with CSS, so it stays sharp and readable at any width."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.ticker import MaxNLocator

from kvqual.report import decision as D
from kvqual.report import fmt as F
from kvqual.report import summary as S


@dataclass(frozen=True)
class Mark:
    """A labelled position on a forest row's track, in percent of its width."""

    at: float
    text: str


@dataclass(frozen=True)
class ForestRow:
    """One criterion of the forest plot: display strings, and its track in percent of the width.

    `ci` is (left, width) of the interval bar; an unbounded side runs to the edge (`open_low`,
    `open_high`). `zone` is the pass region, `reference` the no-change value (0, or 1 for a
    ratio). `note` replaces the track when nothing can be drawn (no estimate)."""

    label: str
    suite: str
    group: str  # "primary", "guard", "health" (failed requests) or "speed"
    status: str
    reading: str
    bound: str
    n: str
    note: str = ""
    holm: str | None = None  # why an interval wholly outside its bound is not a FAIL
    ci: tuple[float, float] | None = None
    open_low: bool = False
    open_high: bool = False
    estimate: float | None = None
    bounds: tuple[Mark, ...] = ()
    zone: tuple[float, float] | None = None
    reference: Mark | None = None
    ticks: tuple[Mark, ...] = ()


FOREST_GROUPS = (
    ("primary", "Primary criteria: each must be shown inside its bound for PASS"),
    ("guard", "Per-suite guards: one shown outside FAILs the candidate; undecided ones do not block PASS"),
    ("health", "Run health: passes when the observed failure rate is within its bound"),
    ("speed", "Speed"),
)


FOREST_LABEL = {
    "accuracy": "accuracy", "accuracy_pooled": "accuracy, all suites (stratified)",
    "kl_excess": "mean KL beyond A/A floor (item mean)", "top1_loss": "same-top-1 loss beyond A/A floor",
    "broken_share": "prompts broken beyond A/A floor",
    "length_ratio": "output length ratio (cand / base)", "truncation_excess": "truncation rate beyond A/A floor",
    "loop_excess": "repetition-loop rate beyond A/A floor", "distinct2_loss": "distinct-2 lost beyond A/A floor",
    "length_ks_excess": "length KS distance beyond A/A floor", "failed_rate_baseline": "failed requests, baseline",
    "failed_rate_candidate": "failed requests, candidate", "failed_rate_base": "failed requests, baseline",
    "failed_rate_cand": "failed requests, candidate", "speedup": "throughput ratio (cand / base)",
    "cache_path": "cache path: warm − cold KL per context",
}


def _group(c: Mapping[str, Any]) -> str:
    name = str(c.get("name") or "")
    if name.startswith("failed_rate"):
        return "health"
    if name == "speedup":
        return "speed"
    return "guard" if c.get("role") == "guard" else "primary"


def _scale(values: Sequence[float], q: str) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    span = hi - lo if hi > lo else max(abs(hi) * 0.2, 1e-9)
    lo, hi = lo - 0.08 * span, hi + 0.08 * span
    if q == "percent" and min(values) >= 0:
        lo = max(lo, 0.0)
    return lo, hi


def forest_row(c: Mapping[str, Any]) -> ForestRow:
    """The forest row of one report.json criterion, on a scale that holds its interval, its
    bound and the no-change value, so neither the interval nor the margin is zoomed away."""
    name = str(c.get("name") or "?")
    q = F.quantity(name)
    status = str(c.get("status") or "not_evaluated")
    common = dict(label=FOREST_LABEL.get(name, S.CRITERION_LABEL.get(name, name)), suite=str(c.get("suite") or "overall"),
                  group=_group(c),
                  status=status, reading=D.reading(c), bound=F.fmt_bound(c),
                  n=f"{F.fmt_num(c.get('n'))} {c.get('unit') or 'items'}", holm=S.holm_note(c))
    est, lo, hi = (F.num(c.get(k)) for k in ("estimate", "ci_low", "ci_high"))
    if est is None and lo is None and hi is None:
        return ForestRow(**common, note=str(c.get("detail") or "no estimate"))
    est, lo, hi = (None if v is None else F.in_units(v, q) for v in (est, lo, hi))
    bounds = [F.in_units(v, q) for v in (F.num(c.get("bound_low")), F.num(c.get("bound_high"))) if v is not None]
    ref = 1.0 if q == "ratio" else 0.0
    left, right = _scale([v for v in (est, lo, hi, ref, *bounds) if v is not None], q)

    def at(v: float) -> float:
        return round(100.0 * (min(max(v, left), right) - left) / (right - left), 2)

    a = at(lo if lo is not None else left)
    b = at(hi if hi is not None else right)
    zone = None
    direction, bl, bh = c.get("direction"), F.num(c.get("bound_low")), F.num(c.get("bound_high"))
    if direction == "at_least" and bl is not None:
        zone = (at(F.in_units(bl, q)), 100.0 - at(F.in_units(bl, q)))
    elif direction == "at_most" and bh is not None:
        zone = (0.0, at(F.in_units(bh, q)))
    elif direction == "within" and bl is not None and bh is not None:
        zone = (at(F.in_units(bl, q)), at(F.in_units(bh, q)) - at(F.in_units(bl, q)))
    signed = q == "points"
    ticks = [t for t in MaxNLocator(nbins=4, steps=[1, 2, 2.5, 5, 10]).tick_values(left, right)
             if left <= t <= right and all(abs(at(float(t)) - at(v)) > 9 for v in bounds)]  # the bound has its label
    unit = F.UNIT_TEXT[q] if q in ("percent", "ratio") else ""
    return ForestRow(
        **common, ci=(a, max(b - a, 0.6)), open_low=lo is None, open_high=hi is None,
        estimate=None if est is None else at(est),
        bounds=tuple(Mark(at(v), F.sig3(v, trim=True) + unit) for v in bounds), zone=zone,
        reference=Mark(at(ref), F.sig3(ref, trim=True) + unit),
        ticks=tuple(Mark(at(float(t)), F.sig3(float(t), signed=signed, trim=True) + unit) for t in ticks),
    )


def forest_rows(report: Mapping[str, Any]) -> list[tuple[str, list[ForestRow]]]:
    """Every criterion of the verdict as forest rows, grouped (primary, guard, health, speed)
    in the gate's order within each group; empty groups left out."""
    rows = [forest_row(c) for c in F.get(report, "verdict", "criteria") or [] if isinstance(c, Mapping)]
    return [(title, [r for r in rows if r.group == key]) for key, title in FOREST_GROUPS
            if any(r.group == key for r in rows)]
