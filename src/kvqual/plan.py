"""What a run sends, in which order: the seeded item order every arm and every round share
(`item_rank`: a hash per item, so any subset keeps its order and the judge can replay a sequential
compare's looks from the samples alone), the (item, repeat) units of a run, its cache waves,
the `RunPlan` that names a run folder, and the price of a next round or look under a time budget
(`next_round_time`). Pure: no server, no file."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Iterable

from kvqual.config import Target
from kvqual.records import GenerationParams, Item
from kvqual.store import run_key
from kvqual.suites import LoadedSuite


Unit = tuple[Item, int]



@dataclass(frozen=True)
class RunPlan:
    """Everything that defines one run of one target."""

    target: Target
    model: str
    suites: tuple[LoadedSuite, ...]
    params: GenerationParams
    limit: int | None = None
    replicate: int = 0  # 0: the run; 1: the A/A replicate of the same target
    fraction: float = 1.0  # share of items this run covers (A/A replicates may cover fewer)

    def identity(self) -> dict[str, Any]:
        return {
            "target": self.target.identity(),
            "model": self.model,
            "suites": [[s.ref.name, s.ref.sha256] for s in self.suites],
            "params": self.params.to_json(),
            "limit": self.limit,
            "replicate": self.replicate,
            "fraction": self.fraction,
        }

    @property
    def key(self) -> str:
        return run_key(self.identity())

    @property
    def run_id(self) -> str:
        """`<target>-<key>`; an A/A replicate sits beside its run as `<target>-<key>-aa<N>[-f<fraction>]`."""
        if self.replicate == 0:
            return f"{self.target.name}-{self.key[:12]}"
        main = run_key({**self.identity(), "replicate": 0, "fraction": 1.0})
        fraction = "" if self.fraction >= 1.0 else f"-f{self.fraction:g}"
        return f"{self.target.name}-{main[:12]}-aa{self.replicate}{fraction}"



def in_fraction(suite: str, item_id: str, fraction: float) -> bool:
    """Deterministic subset by hash of (suite, id): the same items in every A/A replicate."""
    if fraction >= 1.0:
        return True
    digest = hashlib.sha256(f"{suite}\x00{item_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction



def item_rank(suite: str, item_id: str, seed: int) -> bytes:
    """An item's place in the seeded order every arm and every round share. A hash of the item,
    not a shuffle of the pool, so any subset of items keeps the same relative order (the judge
    can replay a sequential compare's looks from the samples alone)."""
    return hashlib.sha256(f"{seed}\x00{suite}\x00{item_id}".encode()).digest()



def item_order(keys: Iterable[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
    """(suite, id) keys in the seeded order of `item_rank`."""
    return sorted(set(keys), key=lambda k: item_rank(k[0], k[1], seed))



def plan_units(suites: tuple[LoadedSuite, ...], repeats: int, seed: int, fraction: float = 1.0,
               items_upto: int | None = None) -> list[Unit]:
    """The (item, repeat) units of the first `items_upto` items in the seeded item order (all
    when None), shuffled with `seed` so both arms send in the same order."""
    items = sorted((item for s in suites for item in s.items), key=lambda i: item_rank(i.suite, i.id, seed))
    if items_upto is not None:
        items = items[:items_upto]
    units = [(item, r) for item in items for r in range(repeats) if in_fraction(item.suite, item.id, fraction)]
    random.Random(seed).shuffle(units)
    return units



def cache_waves(units: list[Unit]) -> list[list[Unit]]:
    """The units in the waves a cache-path suite asks for (item meta `cache_wave`, docs/cache.md):
    every unit of wave 0 is answered before wave 1 is sent, so that a later use of a shared prefix
    finds it in a prefix-caching server's cache (requests scheduled in the same step would not).
    Units without the key are wave 0; each wave keeps the seeded order. One wave when none asks."""
    waves: dict[int, list[Unit]] = {}
    for unit in units:
        wave = unit[0].meta.get("cache_wave", 0) if unit[0].meta else 0
        waves.setdefault(wave if isinstance(wave, int) else 0, []).append(unit)
    return [waves[w] for w in sorted(waves)] or [[]]


def next_round_time(spent: float, items: int, last: float, last_items: int, new_items: int) -> float:
    """The server time a round of `new_items` will take (in the unit of `spent`), from the time `spent` on
    the rounds so far for their `items` and the time the `last` round took for its `last_items`: at the
    slower of the two rates. The last round alone prices a resumed compare, whose earlier rounds were read
    from disk in no time (at their rate the next round would look free); all rounds price a fresh one,
    whose first round carries the A/A floor's second pass."""
    rate = max(spent / items, last / last_items if last_items > 0 else 0.0)
    return rate * new_items
