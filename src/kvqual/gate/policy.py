"""`[gate]` in kvqual.toml: what "as good as the baseline" means, validated.

Every default has a reason in docs/statistics.md ("Defaults and why"); the two token bounds
were derived from known-good and known-bad configs on the default mix, and `kvqual calibrate`
derives them on the user's own (its `[gate.provenance]` sub-table: gate/origin.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from kvqual.errors import ConfigError
from kvqual.gate.origin import Calibration

Mode = Literal["default", "strict"]
Betting = Literal["running", "per_look"]


@dataclass(frozen=True)
class GatePolicy:
    """The gate's bounds, error rate, criterion roles and sequential plan."""

    alpha: float = 0.05  # false-FAIL rate when nothing changed; false-PASS rate at a bound
    mode: Mode = "default"  # "strict": every suite's accuracy must be shown within the margin too
    accuracy_margin: float = 0.05  # δ: cand may lose up to 5 points of accuracy (absolute)
    max_length_drift: float = 0.10  # mean output length within ±10% of the baseline's
    max_kl_excess: float = 0.012  # nats/token of KL(base‖cand) beyond the A/A floor (gate/origin.py: how it was derived)
    max_top1_loss: float = 0.042  # same-top-1 agreement may drop 4.2 points below the A/A floor (gate/origin.py)
    max_trunc_excess: float = 0.05  # truncation (finish_reason=length) rate beyond the A/A floor (guard)
    max_loop_excess: float = 0.05  # repetition-loop rate beyond the A/A floor (guard)
    max_distinct2_loss: float = 0.05  # mean distinct-2 of the outputs may drop 5 points beyond the A/A floor (guard)
    max_length_ks_excess: float = 0.10  # KS distance of the length distributions beyond the A/A floor (guard)
    max_cache_kl_excess: float = 0.012  # warm minus cold KL within a shared context, nats/token (docs/cache.md)
    max_failed_rate: float = 0.01  # share of failed requests per arm
    min_token_coverage: float = 0.8  # teacher forcing on: share of pairs whose token metrics must be usable
    looks: int = 5  # planned looks (rounds) of a sequential compare, at most; 1 = fixed-n
    first_look: int = 124  # items judged at the first look; each later look doubles it (gate/sequential.py)
    token_cap: float = 10.0  # per-unit KL values above this multiple of the KL bound count as it (fixed before the data)
    broken_kl: float = 0.1  # c₀: a prompt whose mean KL(base‖cand) is above this (nats/token) is broken
    max_broken_share: float = 0.01  # π: the candidate may break at most this share of prompts beyond the A/A floor's
    betting: Betting = "running"  # the token criteria's PASS side: one process over the looks at α, or one per look at α′
    min_speedup: float | None = None  # cand/base throughput ratio required; None: report only
    bootstrap_resamples: int = 0  # >0: cluster bootstrap for KL / top-1 instead of t intervals
    provenance: Calibration | None = None  # [gate.provenance]: what `kvqual calibrate` derived the bounds from

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], path: str) -> "GatePolicy":
        """Validate the `[gate]` table; an unknown key, wrong type or bad range raises ConfigError."""
        if not isinstance(data, Mapping):
            raise ConfigError(path, "gate", f"expected a table, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ConfigError(path, f"gate.{key}", f"unknown key (known: {', '.join(sorted(known))})")
            values[key] = _check(path, key, value)
        return cls(**values)


_RANGES: Mapping[str, tuple[float, float, str]] = {
    "alpha": (0.0, 0.5, "between 0 and 0.5 (exclusive)"),
    "accuracy_margin": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_length_drift": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_kl_excess": (0.0, math.inf, "positive"),
    "max_top1_loss": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_trunc_excess": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_loop_excess": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_distinct2_loss": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_length_ks_excess": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_cache_kl_excess": (0.0, math.inf, "positive"),
    "max_failed_rate": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "min_token_coverage": (0.0, 1.0 + 1e-12, "above 0 and at most 1"),
    "min_speedup": (0.0, math.inf, "positive"),
    "token_cap": (1.0, math.inf, "above 1 (a multiple of the bound)"),
    "broken_kl": (0.0, math.inf, "positive (nats/token)"),
    "max_broken_share": (0.0, 1.0, "between 0 and 1 (exclusive)"),
}
_CHOICES: Mapping[str, tuple[str, ...]] = {"mode": ("default", "strict"), "betting": ("running", "per_look")}
_INTEGERS: Mapping[str, tuple[int, str]] = {"bootstrap_resamples": (100, "must be 0 (off) or at least 100"),
                                            "looks": (1, "must be at least 1"),
                                            "first_look": (2, "must be at least 2")}


def _check(path: str, key: str, value: Any) -> Any:
    """Type- and range-check one `[gate]` value."""
    if key == "provenance":
        return Calibration.from_mapping(value, path)
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            words = " or ".join(f'"{c}"' for c in _CHOICES[key])
            raise ConfigError(path, f"gate.{key}", f"must be {words}, got {value!r}")
        return value
    if key in _INTEGERS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"gate.{key}", f"expected an integer, got {type(value).__name__}")
        low, words = _INTEGERS[key]
        if (key == "bootstrap_resamples" and value != 0 and value < low) or (key != "bootstrap_resamples" and value < low):
            raise ConfigError(path, f"gate.{key}", words)
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"gate.{key}", f"expected a number, got {type(value).__name__}")
    low, high, words = _RANGES[key]
    if not low < value < high:
        raise ConfigError(path, f"gate.{key}", f"must be {words}, got {value}")
    return float(value)
