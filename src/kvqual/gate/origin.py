"""Where each bound of `[gate]` came from: kvqual's built-in defaults (with the derivation's own
precision), a `kvqual calibrate` run (its `[gate.provenance]` table), or a value set by hand.

A bound is only as good as its derivation: the built-in token bounds are geometric means of two
124-item point estimates on SmolLM2-135M (docs/statistics.md, "Defaults and why"), so every report
says so, and a calibration states the model, engines, KV dtypes, suites, items and intervals it
rests on. `Calibration.from_mapping` validates `[gate.provenance]` as strictly as `[gate]`: an
unknown key is an error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from kvqual.errors import ConfigError

# criterion name (as the gate emits it) → the [gate] field that bounds it
BOUND_FIELD: Mapping[str, str] = {
    "accuracy": "accuracy_margin", "accuracy_pooled": "accuracy_margin", "kl_excess": "max_kl_excess",
    "top1_loss": "max_top1_loss", "broken_share": "max_broken_share", "length_ratio": "max_length_drift", "truncation_excess": "max_trunc_excess",
    "loop_excess": "max_loop_excess", "distinct2_loss": "max_distinct2_loss",
    "length_ks_excess": "max_length_ks_excess", "cache_path": "max_cache_kl_excess",
    "failed_rate_baseline": "max_failed_rate", "failed_rate_candidate": "max_failed_rate", "speedup": "min_speedup",
}

# The built-in token bounds: geometric means √(g·b) of a known-good (bf16 → fp8_e4m3) and a known-bad
# (bf16 → fp8_e5m2) compare, fixed-n, 124 items, SmolLM2-135M, 2026-12-01. Their 95% ranges: KL from
# the recorded intervals (good upper 0.0067 at est. 0.0056; bad 0.0256 [0.0223, 0.0303], 90% intervals)
# by the delta method on the log scale, var(log √(g·b)) = (var log g + var log b)/4 → −13%/+15% (0.0104 to
# 0.0138); top-1 as the review of issue 51 measured it: 3.2 to 5.6 points (−24% / +33%).
BUILTIN_DERIVED: Mapping[str, tuple[float, float, str]] = {
    "max_kl_excess": (0.0104, 0.0138, "−13%/+15%"),
    "max_top1_loss": (0.032, 0.056, "−24%/+33%"),
}
BUILTIN_SOURCE = "derived on SmolLM2-135M at 124 items"

_ARM_KEYS = ("target", "model", "engine", "kv_cache_dtype")
_CRITERION_KEYS = ("good", "bad", "m1", "margin")


@dataclass(frozen=True)
class CalibratedMargin:
    """One token margin a calibration derived: each config's (estimate, low, high) and M1, the margin."""

    good: tuple[float, float, float]
    bad: tuple[float, float, float]
    m1: float
    margin: float


@dataclass(frozen=True)
class Calibration:
    """`[gate.provenance]`: what a `kvqual calibrate` rests on (docs/statistics.md, "Calibrated margins")."""

    source: str
    created_at: str
    kvqual_version: str
    fraction: float  # the margin is this fraction of M1 (FDA's M2 = f·M1)
    ci_level: float  # the two-sided level of the intervals (their one-sided bounds at (1 + level)/2)
    items: int
    suites: tuple[str, ...]
    baseline: Mapping[str, Any]
    good: Mapping[str, Any]
    bad: Mapping[str, Any]
    kl_excess: CalibratedMargin | None = None
    top1_loss: CalibratedMargin | None = None
    accuracy: Mapping[str, Any] | None = None  # the known-bad's task-score evidence, good and bad (not a margin)

    def margin_of(self, bound_field: str) -> CalibratedMargin | None:
        return {"max_kl_excess": self.kl_excess, "max_top1_loss": self.top1_loss}.get(bound_field)

    @classmethod
    def from_mapping(cls, data: Any, path: str) -> "Calibration":
        """Validate `[gate.provenance]`; an unknown key, a missing one or a wrong type raises ConfigError."""
        where = "gate.provenance"
        if not isinstance(data, Mapping):
            raise ConfigError(path, where, f"expected a table, got {type(data).__name__}")
        known = {f.name: f for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ConfigError(path, f"{where}.{key}", f"unknown key (known: {', '.join(sorted(known))})")
        values: dict[str, Any] = {}
        for key in ("source", "created_at", "kvqual_version"):
            values[key] = _string(data, key, path)
        for key in ("fraction", "ci_level"):
            x = data.get(key)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x < 1:
                raise ConfigError(path, f"{where}.{key}", f"must be a number between 0 and 1, got {x!r}")
            values[key] = float(x)
        items = data.get("items")
        if isinstance(items, bool) or not isinstance(items, int) or items < 1:
            raise ConfigError(path, f"{where}.items", f"must be a positive integer, got {items!r}")
        values["items"] = items
        suites = data.get("suites")
        if not isinstance(suites, list) or not all(isinstance(s, str) for s in suites):
            raise ConfigError(path, f"{where}.suites", "must be a list of strings")
        values["suites"] = tuple(suites)
        for arm in ("baseline", "good", "bad"):
            values[arm] = _table(data, arm, _ARM_KEYS, path)
        for name in ("kl_excess", "top1_loss"):
            if name in data:
                values[name] = _margin(data[name], f"{where}.{name}", path)
        if "accuracy" in data:
            acc = _table(data, "accuracy", ("good", "bad"), path)
            values["accuracy"] = {k: _triple(v, f"{where}.accuracy.{k}", path) for k, v in acc.items()}
        return cls(**values)


def _string(data: Mapping[str, Any], key: str, path: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ConfigError(path, f"gate.provenance.{key}", f"expected a string, got {type(value).__name__}")
    return value


def _table(data: Mapping[str, Any], key: str, allowed: tuple[str, ...], path: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise ConfigError(path, f"gate.provenance.{key}", "expected a table")
    for k in value:
        if k not in allowed:
            raise ConfigError(path, f"gate.provenance.{key}.{k}", f"unknown key (known: {', '.join(allowed)})")
    return dict(value)


def _triple(value: Any, where: str, path: str) -> tuple[float, float, float]:
    if (not isinstance(value, list) or len(value) != 3
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in value)):
        raise ConfigError(path, where, "expected [estimate, low, high]")
    est, low, high = (float(x) for x in value)
    if not low <= est <= high:
        raise ConfigError(path, where, f"expected low ≤ estimate ≤ high, got {value}")
    return est, low, high


def _margin(value: Any, where: str, path: str) -> CalibratedMargin:
    if not isinstance(value, Mapping):
        raise ConfigError(path, where, "expected a table")
    for k in value:
        if k not in _CRITERION_KEYS:
            raise ConfigError(path, f"{where}.{k}", f"unknown key (known: {', '.join(_CRITERION_KEYS)})")
    for k in ("m1", "margin"):
        x = value.get(k)
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0:
            raise ConfigError(path, f"{where}.{k}", f"must be a positive number, got {x!r}")
    return CalibratedMargin(_triple(value.get("good"), f"{where}.good", path),
                            _triple(value.get("bad"), f"{where}.bad", path), float(value["m1"]), float(value["margin"]))


def bound_origin(policy: Any, bound_field: str) -> dict[str, Any]:
    """Where one bound of `policy` came from: {"field", "value", "source", "text", ...}. "calibrate" when
    the policy's calibration derived it (and the value is the one it wrote), "built-in" when it is the
    default, else "kvqual.toml" (set by hand). `text` is the one line the reports print."""
    value = getattr(policy, bound_field)
    default = getattr(type(policy)(), bound_field)  # the built-in value (policy is a GatePolicy)
    cal: Calibration | None = getattr(policy, "provenance", None)
    margin = cal.margin_of(bound_field) if cal is not None else None
    out: dict[str, Any] = {"field": bound_field, "value": value}
    if margin is not None and value is not None and math.isclose(value, margin.margin, rel_tol=1e-9):
        assert cal is not None
        est, low, high = margin.bad
        # the margin's own precision: f × the known-bad's interval (M1 is its lower end)
        out.update(source="calibrate", range=[cal.fraction * low, cal.fraction * high],
                   text=(f"calibrated {cal.created_at[:10]} on {cal.baseline.get('model') or '?'} at {cal.items} items: "
                         f"{cal.fraction:g} × M1, M1 = {low:.3g} the lower bound of known-bad "
                         f"{cal.bad.get('target')}'s {est:.3g} [{low:.3g}, {high:.3g}]"))
    elif value == default and bound_field in BUILTIN_DERIVED:
        low, high, pm = BUILTIN_DERIVED[bound_field]
        out.update(source="built-in", range=[low, high], text=f"built-in default, {BUILTIN_SOURCE}, {pm}")
    elif value == default:
        out.update(source="built-in", range=None, text="built-in default, a policy choice (docs/statistics.md)")
    else:
        out.update(source="kvqual.toml", range=None, text="set in [gate] by hand")
    return out


def bounds_provenance(policy: Any) -> dict[str, Any]:
    """report.json's `provenance`: each bound field the gate read → its origin; and the calibration whole."""
    used = sorted(set(BOUND_FIELD.values()))
    cal: Calibration | None = getattr(policy, "provenance", None)
    from dataclasses import asdict

    return {"bounds": {f: bound_origin(policy, f) for f in used if getattr(policy, f) is not None},
            "calibration": asdict(cal) if cal is not None else None}


def precision_of(policy: Any, criterion_name: str) -> str:
    """A criterion's bound and how precise it is, in words, for the "on its margin" line."""
    bound_field = BOUND_FIELD.get(criterion_name)
    if bound_field is None:
        return "its bound"
    return bound_origin(policy, bound_field)["text"]
