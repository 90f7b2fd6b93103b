"""One arm of a compare as the judge holds it: its samples, the teacher-forcing pass of the baseline's
completions on its server (`Forcing`, arrays read when first used), and the helpers every metric
shares (the key, rounding, clusters)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from kvqual.forced import Forced, load_forced
from kvqual.gate.criteria import CONTEXT_PREFIX
from kvqual.judge import positions as pos
from kvqual.records import Sample


Key = tuple[str, str, int]



class Forcing:
    """One teacher-forcing pass of the baseline's completions: the records (aligned, reason,
    method) and their per-token data as arrays, read from `path` (the teacher file) when first
    used, or built from the records' logprobs when they carry them and there is no path. The
    judge releases a pass's arrays once its comparisons are computed (`TokenArrays.release`):
    two passes' arrays at a time, never three."""

    def __init__(self, records: Mapping[Key, Forced], arrays: pos.TokenArrays | None = None,
                 path: Path | None = None) -> None:
        self.records, self._arrays, self._path = records, arrays, path

    @property
    def arrays(self) -> pos.TokenArrays:
        if self._arrays is None:
            self._arrays = pos.load(self._path, self.records) if self._path else pos.from_logprobs(self.records)
        return self._arrays



@dataclass(frozen=True)
class Arm:
    samples: Mapping[Key, Sample]
    forced: Forcing = field(default_factory=lambda: Forcing({}))  # the baseline's completions forced on this arm's server
    tokens: pos.TokenArrays | None = None  # the samples' generated tokens as codes (else their logprobs)
    topk: Callable[[], pos.TokenArrays] | None = None  # reads the samples' top-k too (the cache probe only)



def rounded(x: float | None, nd: int = 6) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)



def usable(forcing: Forcing, key: Key) -> bool:
    f = forcing.records.get(key)
    return f is not None and f.aligned and key in forcing.arrays.index



def same_windows(ref: Forcing, other: Forcing, key: Key) -> bool:
    """Both passes scored the item's completion in the same windows (or both in one request): a
    token scored with less context in one pass than in the other is not a like-for-like pair."""
    a, b = ref.records.get(key), other.records.get(key)
    return a is not None and b is not None and a.chunks == b.chunks



def cluster_id(s: Sample) -> str:
    """The independent unit a sample belongs to: its shared context, else what it sent (items with
    the same prompt, and the repeats of an item, are one cluster), else its item (runs written before
    prompts were hashed). Prefixes let the gate say "contexts" or "items" (gate/criteria.py)."""
    if s.context_id:
        return f"{CONTEXT_PREFIX}{s.context_id}"
    return f"prompt:{s.prompt_hash}" if s.prompt_hash else f"item:{s.suite}\x00{s.id}"



def clusters_of(samples: list[Sample]) -> np.ndarray:
    return np.array([cluster_id(s) for s in samples], dtype=object)



def floor_reproduced(base: Forcing, again: Forcing) -> bool:
    """The second teacher-forcing pass reproduced the first bit for bit on every item it covered."""
    both = [k for k in again.records if k in base.records]
    if not both or not all(usable(base, k) and usable(again, k) for k in both):
        return False
    return pos.all_reproduced(base.arrays, again.arrays, both)



MIN_REPRODUCED = 8  # items a bit-identical second pass must cover before its floor (0) is extended to all



def forcing_from(path: Path, records: Mapping[tuple[str, str, int], Forced]) -> Forcing:
    """A teacher file's records with their per-token data as arrays (an empty pass when the
    records were left out: teacher forcing off or refused)."""
    if not records:
        return Forcing({})
    return Forcing(records, path=path)  # its arrays are read when first used



def forcing_of(path: Path) -> Forcing:
    """A teacher file, read for the judge: records + arrays."""
    return forcing_from(path, load_forced(path, logprobs=False))
