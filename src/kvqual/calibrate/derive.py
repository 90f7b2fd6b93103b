"""Token margins from a known-good and a known-bad comparison, as a non-inferiority trial sets its
margin from the active control's effect (FDA, "Non-Inferiority Clinical Trials", 2016: M1, M2).

M1 is the effect the known-bad config is *surely* shown to have: the lower confidence bound of its
excess (KL beyond the A/A floor, top-1 loss), not its point estimate, so noise in the bad compare can
only make the margin smaller (stricter). The margin is `fraction` × M1 (M2 = f·M1): a candidate passes
only when its upper bound is below that share of the harm known to break the model. Pure: intervals in,
a margin or a one-line refusal out; the TOML text of the `[gate]` table it makes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any, Mapping, Sequence

from kvqual.errors import CalibrationError, CalibrationUndecided
from kvqual.gate.origin import CalibratedMargin, Calibration

TOKEN_CRITERIA: Mapping[str, str] = {"kl_excess": "max_kl_excess", "top1_loss": "max_top1_loss"}
DEFAULT_FRACTION = 0.5  # FDA's customary M2 = 50% of M1 (docs/statistics.md, "Calibrated margins")

Interval = tuple[float, float, float]  # (estimate, low, high)


def interval_of(criteria: Sequence[Any], name: str) -> Interval | None:
    """The pooled criterion `name`'s (estimate, low, high) among a verdict's criteria, or None when it
    was not evaluated (teacher forcing off or refused)."""
    for c in criteria:
        if c.name == name and c.suite is None and None not in (c.estimate, c.ci_low, c.ci_high) \
                and all(math.isfinite(x) for x in (c.estimate, c.ci_low, c.ci_high)):
            return float(c.estimate), float(c.ci_low), float(c.ci_high)
    return None


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def items_to_separate(good: Interval, bad: Interval, n: int) -> int | None:
    """Items at which the two intervals, shrinking as 1/√n, would no longer overlap; None when the
    estimates are not ordered (no size separates them)."""
    gap = bad[0] - good[0]
    widths = (good[2] - good[0]) + (bad[0] - bad[1])
    if gap <= 0:
        return None
    return max(n + 1, math.ceil(n * (widths / gap) ** 2))


def derive_margin(name: str, good: Interval | None, bad: Interval | None, fraction: float, n: int) -> CalibratedMargin:
    """M1 = the known-bad's lower bound; the margin `fraction` × M1. Refuses (one line) when the
    known-good's upper bound reaches the known-bad's lower bound: exit 3 when the estimates are
    ordered (more items would separate them: how many is said), exit 2 when they are not (the pair
    given is not a known-good and a known-bad one on this criterion)."""
    if good is None or bad is None:
        which = "known-good" if good is None else "known-bad"
        raise CalibrationError(f"{name}: the {which} compare has no estimate (teacher forcing off or refused); "
                               "calibrate needs teacher-forced token metrics on both")
    if good[2] >= bad[1]:
        more = items_to_separate(good, bad, n)
        where = (f"known-good {_fmt(good[0])} [{_fmt(good[1])}, {_fmt(good[2])}] overlaps known-bad "
                 f"{_fmt(bad[0])} [{_fmt(bad[1])}, {_fmt(bad[2])}] on {n} items")
        if more is None:
            raise CalibrationError(f"{name}: {where}, and the known-bad's estimate is not above the known-good's: "
                                   "no number of items separates them; give a config known to be worse")
        raise CalibrationUndecided(f"{name}: {where}; about {more:,} items (a larger suite or --seed "
                                   "pool), or a clearly worse known-bad config, would separate them")
    m1 = bad[1]
    return CalibratedMargin(good, bad, m1, float(f"{fraction * m1:.4g}"))


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def gate_table(cal: Calibration, notes: Sequence[str] = ()) -> str:
    """The `[gate]` table (the calibrated bounds) and its `[gate.provenance]`, as TOML text that
    `kvqual.toml` accepts (GatePolicy.from_mapping)."""
    lines = ["# written by kvqual calibrate: paste into kvqual.toml (docs/statistics.md, \"Calibrated margins\")"]
    lines += [f"# {n}" for n in notes]
    lines.append("[gate]")
    for name, bound_field in TOKEN_CRITERIA.items():
        margin = cal.margin_of(bound_field)
        if margin is not None:
            lines.append(f"{bound_field} = {margin.margin!r}")
    lines += ["", "[gate.provenance]"]
    data = asdict(cal)
    for key, value in data.items():
        if key in TOKEN_CRITERIA or value is None:
            continue
        lines.append(f"{key} = {_toml_value(value)}")
    for name in TOKEN_CRITERIA:
        if data.get(name) is not None:
            lines += ["", f"[gate.provenance.{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in data[name].items()]
    return "\n".join(lines) + "\n"
