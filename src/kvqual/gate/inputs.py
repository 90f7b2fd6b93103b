"""What the gate judges: per-unit paired arrays, each unit tagged with its cluster.

A unit is one (suite, item id, repeat). Its cluster is the item — or the item's shared
context (`context_id`) when it has one — so repeats of an item, and items built on one
document, never count as independent evidence. `clusters=None` means every unit is its own
cluster (one repeat, no shared contexts).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def _array(value: Any, dtype: type, name: str) -> np.ndarray:
    a = np.asarray(value, dtype=dtype)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D")
    return a


def _same_length(obj: Any, names: tuple[str, ...]) -> None:
    lengths = {n: len(getattr(obj, n)) for n in names if getattr(obj, n) is not None}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{type(obj).__name__}: arrays differ in length: {lengths}")


def _freeze(obj: Any, arrays: dict[str, type]) -> None:
    for name, dtype in arrays.items():
        object.__setattr__(obj, name, _array(getattr(obj, name), dtype, name))
    if getattr(obj, "clusters", None) is not None:
        object.__setattr__(obj, "clusters", np.asarray(obj.clusters, dtype=object))
    _same_length(obj, tuple(arrays) + ("clusters",))


def n_clusters(clusters: np.ndarray | None, n: int) -> int:
    """Independent units behind n values: distinct clusters, or n when none are given."""
    return n if clusters is None else int(np.unique(clusters.astype(str)).size)


@dataclass(frozen=True)
class AccuracyPairs:
    """One suite's scored units: correct or not in each arm."""

    suite: str
    base_correct: np.ndarray
    cand_correct: np.ndarray
    clusters: np.ndarray | None = None

    def __post_init__(self) -> None:
        _freeze(self, {"base_correct": bool, "cand_correct": bool})


@dataclass(frozen=True)
class LengthPairs:
    """Output lengths in tokens of one arm vs another, paired by unit."""

    base: np.ndarray
    cand: np.ndarray
    clusters: np.ndarray | None = None

    def __post_init__(self) -> None:
        _freeze(self, {"base": float, "cand": float})


@dataclass(frozen=True)
class RatePairs:
    """A per-unit event (truncated, looping: 0 or 1) or share (repeated bigrams: 1 − distinct-2 of
    the output) in the baseline and candidate on every pair, and in the baseline and its A/A
    replicate on the pairs the replicate covers (the floor). Higher is worse."""

    name: str
    base: np.ndarray
    cand: np.ndarray
    clusters: np.ndarray | None = None
    floor_base: np.ndarray | None = None
    floor_aa: np.ndarray | None = None
    floor_clusters: np.ndarray | None = None

    def __post_init__(self) -> None:
        _freeze(self, {"base": float, "cand": float})
        if (self.floor_base is None) != (self.floor_aa is None):
            raise ValueError("floor_base and floor_aa come together")
        if self.floor_base is not None:
            object.__setattr__(self, "floor_base", _array(self.floor_base, float, "floor_base"))
            object.__setattr__(self, "floor_aa", _array(self.floor_aa, float, "floor_aa"))
            if self.floor_base.size != self.floor_aa.size:
                raise ValueError("RatePairs: floor arrays differ in length")


@dataclass(frozen=True)
class TokenPairs:
    """Per-unit teacher-forced metrics: candidate vs baseline and the A/A floor, same units."""

    kl_cand: np.ndarray | None  # mean per-token KL(A‖B) of each unit; None: not measured (`kl_missing` says why)
    kl_floor: np.ndarray | None  # mean per-token KL(A‖A') of the same unit
    top1_cand: np.ndarray  # share of the unit's tokens where A and B agree on top-1
    top1_floor: np.ndarray  # same for A vs A'
    clusters: np.ndarray | None = None
    floor_note: str = ""  # how the floor was obtained (measured, or reproduced bit for bit)
    kl_missing: str = ""  # why there is no KL (`kvqual audit` without a candidate server has one distribution)
    rank: np.ndarray | None = None  # each unit's place in the plan's seeded order (None: the order given)

    def __post_init__(self) -> None:
        if (self.kl_cand is None) != (self.kl_floor is None):
            raise ValueError("kl_cand and kl_floor come together")
        kl = {} if self.kl_cand is None else {"kl_cand": float, "kl_floor": float}
        _freeze(self, {**kl, "top1_cand": float, "top1_floor": float, **({"rank": int} if self.rank is not None else {})})


@dataclass(frozen=True)
class BrokenUnits:
    """The tail criterion's units (gate/tail.py `broken_units` builds them): per unit, whether the
    candidate broke it (its mean teacher-forced KL above `broken_kl`, or an answer that is not data
    where the baseline answered) and whether the A/A floor did (the baseline's second pass above
    `broken_kl`), with its cluster and its place in the plan's seeded order. `unusable`: the units
    broken by an answer that is not data."""

    cand: np.ndarray
    floor: np.ndarray
    clusters: np.ndarray | None = None
    rank: np.ndarray | None = None
    unusable: np.ndarray | None = None

    def __post_init__(self) -> None:
        extra = {name: dtype for name, dtype in (("rank", int), ("unusable", bool)) if getattr(self, name) is not None}
        _freeze(self, {"cand": bool, "floor": bool, **extra})


@dataclass(frozen=True)
class UnusableAnswers:
    """Units the baseline answered and the candidate answered with something that is not data (NaN
    logprobs, a body that is not JSON), which therefore have no token metrics: the candidate's
    own outcome, a broken prompt each (gate/tail.py). Their clusters and places in the seeded order."""

    clusters: np.ndarray
    rank: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "clusters", np.asarray(self.clusters, dtype=object))
        if self.rank is not None:
            object.__setattr__(self, "rank", _array(self.rank, int, "rank"))


def seeded(rank: np.ndarray | None, n: int) -> np.ndarray:
    """The units' indices in the plan's seeded order (stable; the order given when no rank is)."""
    return np.arange(n) if rank is None else np.argsort(rank, kind="stable")


def first_rank(codes: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Per unit, the smallest rank among its cluster's units (`codes`: cluster codes)."""
    low = np.full(int(codes.max()) + 1 if codes.size else 0, np.iinfo(np.int64).max)
    np.minimum.at(low, codes, ranks)
    return low[codes]


def cluster_firsts(clusters: np.ndarray | None, n: int) -> tuple[np.ndarray, int]:
    """Each unit's cluster as a code numbered by first appearance in the order given (0 for the first
    cluster met, ...), and the number of clusters: the clusters' order is their first unit's."""
    if clusters is None:
        return np.arange(n), n
    codes = np.unique(clusters.astype(str), return_inverse=True)[1]
    first = np.full(int(codes.max()) + 1 if n else 0, n)
    np.minimum.at(first, codes, np.arange(n))
    order = np.empty_like(first)
    order[np.argsort(first, kind="stable")] = np.arange(first.size)
    return order[codes], int(first.size)


@dataclass(frozen=True)
class TokenCoverage:
    """How many pairs teacher forcing was asked for, how many gave usable token metrics, and why
    the rest did not (reason → count). `requested=False`: the user turned teacher forcing off."""

    requested: bool
    pairs: int = 0
    usable: int = 0
    reasons: Counter = field(default_factory=Counter)
    failed: int = 0  # of the pairs left out: those whose teacher-forcing requests failed after their retries
    # pairs not in `pairs` at all: an arm's answer failed after its retries (tolerated under max_failed_rate), so
    # there was nothing to teacher-force; counted to tell a shortfall they caused from one in the data
    unanswered: int = 0

    @property
    def share(self) -> float:
        return self.usable / self.pairs if self.pairs else 0.0


@dataclass(frozen=True)
class CachePairs:
    """The cache-path probe (docs/cache.md): per unit of a shared context, how far the candidate's
    generated distributions sit from its own cold teacher-forced ones beyond the baseline's same
    distance (`values`), and whether the candidate served that unit from its prefix cache (`warm`).
    The criterion contrasts warm and cold units within each shared context. `role`: "primary"
    when the compare runs a probe suite, else "guard"; `note`: how many units, or why none."""

    values: np.ndarray
    warm: np.ndarray
    clusters: np.ndarray | None = None
    role: str = "guard"
    note: str = ""

    def __post_init__(self) -> None:
        _freeze(self, {"values": float, "warm": bool})


@dataclass(frozen=True)
class RequestCounts:
    """Failed and total requests of one arm (prompts that do not fit a context left out of both), and
    the retries spent on them."""

    failed: int
    total: int
    retries: int = 0


@dataclass(frozen=True)
class SteadySpeed:
    """Steady-state output tok/s at saturation from `kvqual load` (docs/speed.md): each arm's batch
    means over its steady window (independent arms: they ran one after the other). Not per item:
    the same evidence at every look. `source` says where it comes from (file, concurrency, windows)."""

    base: np.ndarray
    cand: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("base", "cand"):
            object.__setattr__(self, name, _array(getattr(self, name), float, name))


@dataclass(frozen=True)
class GateInputs:
    """Everything the gate judges; a part left None is reported as not evaluated."""

    accuracy: tuple[AccuracyPairs, ...] = ()
    lengths: LengthPairs | None = None  # candidate (cand) vs baseline (base)
    lengths_floor: LengthPairs | None = None  # baseline replicate vs baseline: reported
    tokens: TokenPairs | None = None
    unusable: UnusableAnswers | None = None  # the candidate's answers that were not data (broken prompts)
    coverage: TokenCoverage | None = None  # None: not told (treated as requested and complete)
    rates: tuple[RatePairs, ...] = ()  # truncation, repetition loops, repeated bigrams (distinct-2)
    base_requests: RequestCounts | None = None
    cand_requests: RequestCounts | None = None
    base_throughput: np.ndarray | None = None  # per-request tokens/s
    cand_throughput: np.ndarray | None = None
    cache: CachePairs | None = None  # the cache-path probe; None: the compare has none
    steady_speed: SteadySpeed | None = None  # `--speed-from` a load.json: speedup judged on it instead
