"""Numbers as people read them in every report: significant figures, real minus signs, a
criterion's quantity in its units (points, %, nats/token, ×), intervals, times; and `get`, the
one safe walk through report.json's nested dicts."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Literal

MISSING = "—"
NOT_MEASURED = "not measured"



def num(value: Any) -> float | None:
    """`value` as a float when it is a real number (not a bool, not missing), else None."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None



def get(mapping: Any, *keys: str | int) -> Any:
    """Walk nested dicts/lists, returning None at the first missing or null step."""
    value = mapping
    for key in keys:
        if value is None:
            return None
        if isinstance(key, int):
            if not isinstance(value, Sequence) or isinstance(value, str) or key >= len(value):
                return None
            value = value[key]
        else:
            if not isinstance(value, Mapping):
                return None
            value = value.get(key)
    return value



MINUS = "\u2212"  # a real minus sign: "−2.78", never a hyphen



def sig3(value: float, *, signed: bool = False, trim: bool = False) -> str:
    """`value` to three significant figures: '−2.78', '0.00554', '1.00', '1,230'.

    `signed` writes '+' before a positive value (differences); `trim` drops trailing zeros
    ('1.00' → '1'), for numbers that were set rather than measured (bounds, axis ticks)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else MINUS + "∞"
    rounded = float(f"{value:.3g}")
    if rounded == 0:
        return "0"
    mag = math.floor(math.log10(abs(rounded)))
    if mag < -4:
        text = f"{rounded:.2e}"
    elif mag >= 3:
        text = f"{rounded:,.0f}"
    else:
        text = f"{rounded:.{2 - mag}f}"
        if trim and "." in text:
            text = text.rstrip("0").rstrip(".")
    if signed and rounded > 0:
        text = "+" + text
    return text.replace("-", MINUS)



def fmt_num(value: Any) -> str:
    """A number for a table: ints as is (with thousands separators), floats to three
    significant figures without trailing zeros, null as '—'."""
    if value is None or isinstance(value, bool):
        return MISSING if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}".replace("-", MINUS)
    if isinstance(value, float):
        return sig3(value, trim=True)
    return str(value)



# What each criterion measures, in the units people read. report.json keeps fractions; the
# display multiplies: a difference of two rates reads in points, a failure rate in %.
Quantity = Literal["points", "percent", "nats", "ratio"]



_QUANTITY: Mapping[str, Quantity] = {
    "accuracy": "points", "accuracy_pooled": "points", "truncation_excess": "points", "loop_excess": "points",
    "distinct2_loss": "points", "length_ks_excess": "points",
    "top1_loss": "points", "broken_share": "points", "kl_excess": "nats", "length_ratio": "ratio", "speedup": "ratio", "cache_path": "nats",
}



_SCALE: Mapping[str, float] = {"points": 100.0, "percent": 100.0, "nats": 1.0, "ratio": 1.0}



UNIT_TEXT: Mapping[str, str] = {"points": " points", "percent": "%", "nats": " nats/token", "ratio": "×"}



def quantity(name: str) -> Quantity:
    """The quantity a criterion measures: 'points', 'percent' (failure rates), 'nats' or 'ratio'."""
    if name.startswith("failed_rate"):
        return "percent"
    return _QUANTITY.get(name, "ratio" if name.endswith("ratio") else "points")



def in_units(value: float, q: str) -> float:
    """A report.json value (a fraction, nats, a ratio) on the display scale of quantity `q`."""
    return value * _SCALE.get(q, 1.0)



def fmt_quantity(value: Any, q: str, *, unit: bool = True, trim: bool = False, signed: bool | None = None) -> str:
    """One value of quantity `q`: '−2.78 points', '0.00554 nats/token', '3.13%', '1.04×'.
    Points are differences, so they carry a sign unless `signed` is False."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return MISSING
    text = sig3(in_units(float(value), q), signed=q == "points" if signed is None else signed, trim=trim)
    return text + (UNIT_TEXT.get(q, "") if unit or q == "percent" else "")



def fmt_quantity_interval(lo: Any, hi: Any, q: str) -> str:
    """'[−8.27, +4.57]' in the quantity's display scale (each end with '%' for percentages);
    a null end is an unbounded side: '[0.013, ∞)'."""
    if lo is None and hi is None:
        return MISSING
    left = "(" + MINUS + "∞" if lo is None else "[" + fmt_quantity(lo, q, unit=False)
    right = "∞)" if hi is None else fmt_quantity(hi, q, unit=False) + "]"
    return f"{left}, {right}"



def fmt_pct(value: Any) -> str:
    """A rate in [0, 1] shown as a percentage with one decimal, null as '—'."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return MISSING
    return f"{100.0 * value:.1f}%"



def fmt_interval(pair: Any) -> str:
    """A [lo, hi] pair as '[lo, hi]'; '—' when absent or both ends are null. One null end is an
    unbounded side (report.json writes ±inf as null): '[lo, ∞)', '(−∞, hi]'."""
    lo, hi = get(pair, 0), get(pair, 1)
    if lo is None and hi is None:
        return MISSING
    return ("(" + MINUS + "∞" if lo is None else f"[{fmt_num(lo)}") + ", " + ("∞)" if hi is None else f"{fmt_num(hi)}]")



def fmt_time(value: Any) -> str:
    """A timestamp: ISO text as given, epoch seconds as ISO 8601 UTC, null as '—'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        moment = datetime.fromtimestamp(float(value), tz=timezone.utc)
        return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
    return MISSING if value is None else str(value)



def fmt_scale(value: Any) -> str:
    """A KV scale: one number, or per-layer values summarised as 'N values, min–max'."""
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        nums = [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if not nums:
            return f"{len(value)} values" if value else MISSING
        lo, hi = min(nums), max(nums)
        span = fmt_num(float(lo)) if lo == hi else f"{fmt_num(float(lo))}–{fmt_num(float(hi))}"
        return f"{len(value)} values, {span}" if len(value) > 1 else span
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{float(value):.4g}" if float(value) != int(value) else f"{float(value):.1f}"
    return str(value)



def fmt_bound(criterion: Mapping[str, Any]) -> str:
    """The pass region of a criterion in its units: '≥ −5 points', '≤ 0.012 nats/token', '≤ 1%'
    or 'within [0.9, 1.1]' (a ratio)."""
    direction = criterion.get("direction")
    lo, hi = criterion.get("bound_low"), criterion.get("bound_high")
    q = quantity(str(criterion.get("name") or ""))
    if direction == "at_least" and lo is not None:
        return f"≥ {fmt_quantity(lo, q, trim=True, signed=False)}"
    if direction == "at_most" and hi is not None:
        return f"≤ {fmt_quantity(hi, q, trim=True, signed=False)}"
    if lo is None and hi is None:
        return MISSING
    ends = ["?" if v is None else fmt_quantity(v, q, unit=False, trim=True, signed=False) for v in (lo, hi)]
    return f"within [{ends[0]}, {ends[1]}]" + ("" if q in ("ratio", "percent") else UNIT_TEXT[q])
