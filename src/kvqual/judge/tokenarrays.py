"""One token file's per-token data as flat arrays, what judge/positions.py compares.

`TokenArrays`: one file's per-token data as flat arrays. Row r's positions are
`starts[r]:starts[r+1]`; tokens and top-k entries are int64 *codes* — a token id is its own
code, any other string a negative code from its hash (equal strings, equal codes, within one
process), so comparisons never touch Python strings. `load` reads a results file's token file
(`tokenstore.py`) a batch at a time, `from_logprobs` in-memory records; `top1` is every position's
top-1 code, ties broken by token string as `tokens.same_top1` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvqual import tokenstore

Key = tuple[str, str, int]
PAD = -1  # code of an empty top-k slot
_MASK = (1 << 61) - 1
_ID = re.compile(r"token_id:(0|[1-9][0-9]*)\Z")
CHUNK = 1 << 16  # positions per vectorized step: its (CHUNK, k) temporaries stay in cache (4x faster than 1 << 18)


def _code(s: str) -> int:
    m = _ID.match(s)
    return int(m.group(1)) if m else -2 - (hash(s) & _MASK)


def _codes(strings: pa.Array, names: dict[int, str]) -> np.ndarray:
    """int64 codes of a string array (through its distinct values only); `names` learns code → string."""
    if len(strings) == 0:
        return np.zeros(0, dtype=np.int64)
    uniq = pc.unique(strings)
    values = uniq.to_pylist()
    codes = np.fromiter((_code(s) for s in values), dtype=np.int64, count=len(values))
    names.update(zip(codes.tolist(), values))
    return codes[pc.index_in(strings, value_set=uniq).to_numpy(zero_copy_only=False)]


def _narrow(codes: np.ndarray) -> np.ndarray:
    """int32 where every code fits (token ids and PAD: half the memory), else int64 (string hashes)."""
    if codes.size and codes.min() >= PAD and codes.max() < 2**31:
        return codes.astype(np.int32)
    return codes


def _offsets(lists: pa.ListArray) -> np.ndarray:
    return lists.offsets.to_numpy().astype(np.int64, copy=False)


def _flat_lists(table: pa.Table, ids_col: str, str_col: str, names: dict[int, str],
                use_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the ids list where `use_ids` else the strings list, as (codes, row starts)."""
    ids = table.column(ids_col).combine_chunks()
    strs = table.column(str_col).combine_chunks()
    if use_ids.all():
        return ids.flatten().to_numpy().astype(np.int64, copy=False), _offsets(ids)
    if not use_ids.any():
        return _codes(strs.flatten(), names), _offsets(strs)
    parts, starts = [], [0]
    for r in range(table.num_rows):  # mixed rows (rare): one at a time
        vals = ids[r].values.to_numpy().astype(np.int64, copy=False) if use_ids[r] else _codes(strs[r].values, names)
        parts.append(vals)
        starts.append(starts[-1] + vals.size)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64), np.asarray(starts, dtype=np.int64)


@dataclass
class TokenArrays:
    """One token file's rows as flat arrays (module docstring)."""

    index: dict[Key, int]
    starts: np.ndarray  # rows + 1 position offsets
    tokens: np.ndarray  # (P,) int64 codes
    logprob: np.ndarray | None = None  # (P,) float64, NaN where a position has none
    top_codes: np.ndarray | None = None  # (P, K) int64, PAD where a position has fewer than K
    top_lp: np.ndarray | None = None  # (P, K) float32, -inf at PAD
    top_ok: np.ndarray | None = None  # (rows,) bool: one top-k list per token
    names: dict[int, str] = field(default_factory=dict)  # code → string for non-id codes
    released: bool = False  # the per-position arrays were dropped (`release`): only `index` is left
    _top1: np.ndarray | None = field(default=None, repr=False)  # (P,) top-1 code of every position (`top1`)

    @classmethod
    def from_table(cls, table: pa.Table, top_k: bool = True) -> "TokenArrays":
        out = cls._converted(table, top_k)
        out.tokens = _narrow(out.tokens)
        if out.top_codes is not None:
            out.top_codes = _narrow(out.top_codes)
        return out

    @classmethod
    def _converted(cls, table: pa.Table, top_k: bool) -> "TokenArrays":
        """`from_table` before its codes are narrowed: int64 codes, views of the table's buffers
        wherever a reshape allows (what `_Placer` copies into a file's arrays)."""
        names: dict[int, str] = {}
        index = {k: i for i, k in enumerate(tokenstore.keys_of(table))}
        are_ids = table.column("tokens_are_ids").to_numpy(zero_copy_only=False).astype(bool)
        tokens, starts = _flat_lists(table, "token_ids", "tokens", names, are_ids)
        out = cls(index, starts, tokens, names=names)
        if not top_k:
            return out
        if table.num_rows == 0:
            out.logprob, out.top_ok = np.zeros(0), np.zeros(0, dtype=bool)
            out.top_codes, out.top_lp = np.zeros((0, 1), dtype=np.int64), np.zeros((0, 1), dtype=np.float32)
            return out
        lp = table.column("token_logprobs").combine_chunks().flatten().cast(pa.float64())
        out.logprob = lp.to_numpy(zero_copy_only=False)  # nulls (no logprob) as NaN; a view when there are none
        top_ids = table.column("top_ids").combine_chunks()
        with_ids = np.asarray(top_ids.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        inner_ids = cls._inner(top_ids, table.column("top_tokens").combine_chunks(), with_ids)
        codes, inner_starts, per_row = inner_ids(names)
        lps = table.column("top_logprobs").combine_chunks()
        lp_values = lps.flatten().flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
        lengths = np.diff(inner_starts)
        k = int(lengths.max()) if lengths.size else 0
        p = lengths.size
        if p and (lengths == k).all() and lp_values.size == codes.size:  # every position lists k: a reshape
            out.top_codes, out.top_lp = codes.reshape(p, k), lp_values.reshape(p, k)
        else:
            out.top_codes = np.full((p, max(k, 1)), PAD, dtype=codes.dtype)
            out.top_lp = np.full((p, max(k, 1)), -np.inf, dtype=np.float32)
            row_of = np.repeat(np.arange(p), lengths)
            col_of = np.arange(codes.size) - np.repeat(inner_starts[:-1], lengths)
            out.top_codes[row_of, col_of] = codes
            if lp_values.size == codes.size:
                out.top_lp[row_of, col_of] = lp_values
        out.top_ok = (per_row == np.diff(starts)) & (lp_values.size == codes.size)
        return out

    @staticmethod
    def _inner(top_ids: pa.ListArray, top_tokens: pa.ListArray, with_ids: np.ndarray):
        def build(names: dict[int, str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """(codes of every top-k entry, starts of each position's entries, positions per row)."""
            if with_ids.all():
                inner = top_ids.flatten()
                return inner.flatten().to_numpy().astype(np.int64, copy=False), _offsets(inner), np.diff(_offsets(top_ids))
            if not with_ids.any():
                inner = top_tokens.flatten()
                return _codes(inner.flatten(), names), _offsets(inner), np.diff(_offsets(top_tokens))
            codes, lens, per_row = [], [], []
            for r in range(len(top_ids)):  # mixed rows (rare)
                lists = top_ids[r].values if with_ids[r] else top_tokens[r].values
                per_row.append(len(lists))
                for pos in range(len(lists)):
                    vals = lists[pos].values
                    codes.append(vals.to_numpy().astype(np.int64, copy=False) if with_ids[r] else _codes(vals, names))
                    lens.append(len(vals))
            starts = np.zeros(len(lens) + 1, dtype=np.int64)
            np.cumsum(lens, out=starts[1:])
            return (np.concatenate(codes) if codes else np.zeros(0, np.int64)), starts, np.asarray(per_row)
        return build

    def release(self) -> None:
        """Drop the per-position arrays, keeping which keys have rows (`index`): what is left answers
        `key in index`, and nothing else."""
        self.tokens = np.zeros(0, dtype=np.int32)
        self.logprob = self.top_codes = self.top_lp = self._top1 = None
        self.released = True

    def top1(self) -> np.ndarray:
        """The top-1 code of every position (`_top1`), computed once: the baseline's first teacher
        pass is compared twice (with the candidate's and with its own second pass)."""
        assert not self.released, "per-position arrays used after release()"
        if self._top1 is None:
            p = self.top_codes.shape[0]
            out = np.empty(p, dtype=self.top_codes.dtype)
            for s in range(0, p, CHUNK):  # slices: views, no copies
                out[s:s + CHUNK] = _top1(self.top_codes[s:s + CHUNK], self.top_lp[s:s + CHUNK], self)
            self._top1 = out
        return self._top1

    def is_top1(self, x: np.ndarray) -> np.ndarray:
        """Per position of `x`: its own token is a top-1 there — it is `top1()`, or its logprob equals the
        highest listed (a tie counts, whichever of the tied tokens the server put in its top-k). So the
        answer does not depend on how many top logprobs were asked: with top-1 a server lists one of the
        tied tokens, with top-5 all of them, and `top1()` breaks the tie by string."""
        assert not self.released, "per-position arrays used after release()"
        out = self.top1()[x] == self.tokens[x]
        if self.logprob is None or self.top_lp is None:
            return out
        for s in range(0, x.size, CHUNK):  # in float32, as the top-k is kept: the same value compares equal
            xs = x[s:s + CHUNK]
            out[s:s + CHUNK] |= self.logprob[xs].astype(np.float32) >= self.top_lp[xs].max(axis=1)
        return out

    def rows(self, keys: Iterable[Key]) -> np.ndarray:
        assert not self.released, "per-position arrays used after release()"
        return np.fromiter((self.index[k] for k in keys), dtype=np.int64)

    def lengths(self, rows: np.ndarray) -> np.ndarray:
        return self.starts[rows + 1] - self.starts[rows]

    def name(self, code: int) -> str:
        return f"{tokenstore.ID_PREFIX}{code}" if code >= 0 else self.names[code]

    def tokens_of(self, key: Key) -> np.ndarray:
        r = self.index[key]
        return self.tokens[self.starts[r]:self.starts[r + 1]]


def load(jsonl: Path, records: Mapping[Key, object] = {}, top_k: bool = True) -> TokenArrays:
    """The per-token data of a JSONL results file as arrays: its token file, a batch at a time
    (only the columns needed: the generation runs' top-k is not read), plus the `records` that
    carry their logprobs inline (lines written before the token files). Two passes over the
    batches: the first reads only their list offsets (how many positions, how wide a top-k), the
    second converts each batch straight into the file's arrays, allocated once at their final size
    (`_Placer`). The file's Arrow form is never in memory whole beside its arrays, and no batch's
    arrays are made only to be joined (at 20k items the joins' copies into fresh pages were a
    tenth of the judge's CPU)."""
    cols = None if top_k else ["token_ids", "tokens", "tokens_are_ids"]
    schema = tokenstore.SCHEMA if cols is None else pa.schema([tokenstore.SCHEMA.field(c) for c in tokenstore.with_key(cols)])
    inline = _inline(records)
    path = tokenstore.tokens_path(jsonl)

    def tables() -> Iterator[pa.Table]:
        if inline.num_rows:
            yield inline.select(schema.names)
        for batch in tokenstore.iter_batches(path, cols):
            yield pa.Table.from_batches([batch])

    extents = [_extent(t, top_k) for t in tables()]
    if not extents:
        return TokenArrays.from_table(schema.empty_table(), top_k)
    placer = _Placer(extents, top_k)
    for table, extent in zip(tables(), extents):  # batches appended since the first pass are not read
        placer.place(TokenArrays._converted(table, top_k), extent, path)
    out = placer.done(path)
    # the file's Arrow batches are gone; pyarrow's allocator (mimalloc) would keep their pages resident
    # for later Arrow allocations, which the judge no longer makes: ~170 MB of peak RSS at 20k items
    pa.default_memory_pool().release_unused()
    return out


def _extent(table: pa.Table, top_k: bool) -> tuple[int, int, int]:
    """(rows, positions, widest top-k list) of a token-file table, from its list offsets alone:
    the shape `TokenArrays._converted` gives it (each row's positions are its ids where it has
    them as ids, else its strings)."""
    are_ids = table.column("tokens_are_ids").to_numpy(zero_copy_only=False).astype(bool)
    lengths = [np.diff(_offsets(table.column(c).combine_chunks())) for c in ("token_ids", "tokens")]
    positions = int(np.where(are_ids, lengths[0], lengths[1]).sum()) if table.num_rows else 0
    width = 0
    if top_k:
        for col in ("top_ids", "top_tokens"):
            inner = table.column(col).combine_chunks().flatten()
            if len(inner):
                width = max(width, int(np.diff(_offsets(inner)).max()))
    return table.num_rows, positions, width


class _Placer:
    """One file's `TokenArrays`, allocated once for every table of it (`_extent`s) and filled table
    by table in order: a later row of a key wins, as in the file. Codes are stored as int32 while
    every code fits (token ids and PAD), else as int64 from the table that needs it on (string
    hashes, rare: a copy of what is placed so far). A top-k list narrower than the widest is
    padded (PAD / -inf)."""

    def __init__(self, extents: Sequence[tuple[int, int, int]], top_k: bool) -> None:
        rows, positions = sum(e[0] for e in extents), sum(e[1] for e in extents)
        width = max(1, max(e[2] for e in extents))
        self.out = TokenArrays({}, np.zeros(rows + 1, dtype=np.int64), np.empty(positions, dtype=np.int32))
        if top_k:
            self.out.logprob = np.empty(positions, dtype=np.float64)
            self.out.top_codes = np.empty((positions, width), dtype=np.int32)
            self.out.top_lp = np.empty((positions, width), dtype=np.float32)
            self.out.top_ok = np.empty(rows, dtype=bool)
        self.row = self.pos = 0

    def place(self, part: TokenArrays, extent: tuple[int, int, int], path: Path) -> None:
        out, r0, p0 = self.out, self.row, self.pos
        rows, n = part.starts.size - 1, int(part.starts[-1])
        if (rows, n) != extent[:2]:
            raise RuntimeError(f"{path}: a batch changed between two reads "
                               f"({extent[:2]} -> {(rows, n)} rows, positions)")
        out.index.update((k, i + r0) for k, i in part.index.items())
        out.names.update(part.names)
        out.starts[r0 + 1:r0 + rows + 1] = part.starts[1:] + p0
        out.tokens = _put(out.tokens, p0, part.tokens, PAD)
        if out.top_codes is not None:
            assert part.logprob is not None and part.top_codes is not None and part.top_lp is not None
            out.logprob[p0:p0 + n] = part.logprob
            out.top_codes = _put(out.top_codes, p0, part.top_codes, PAD)
            out.top_lp = _put(out.top_lp, p0, part.top_lp, -np.inf)
            out.top_ok[r0:r0 + rows] = part.top_ok
        self.row, self.pos = r0 + rows, p0 + n

    def done(self, path: Path) -> TokenArrays:
        if self.pos != self.out.tokens.shape[0] or self.row != self.out.starts.size - 1:
            raise RuntimeError(f"{path}: fewer rows on the second read than on the first")
        return self.out


def _put(dst: np.ndarray, at: int, src: np.ndarray, fill: float) -> np.ndarray:
    """`src` written into rows at.. of `dst` (its columns first, `fill` after them); `dst` widened to
    int64 first when `src`'s codes do not fit its int32. Returns the array written (`dst` or its
    widened copy)."""
    if dst.dtype == np.int32 and src.size and (src.min() < PAD or src.max() >= 2**31):
        dst = dst.astype(np.int64)
    rows = slice(at, at + src.shape[0])
    if src.ndim == 1:
        dst[rows] = src
    else:
        w = src.shape[1]
        dst[rows, :w] = src
        if w < dst.shape[1]:
            dst[rows, w:] = fill
    return dst


def from_logprobs(records: Mapping[Key, object], top_k: bool = True) -> TokenArrays:
    """Arrays from in-memory records with `.logprobs` (tests, and records read without a file)."""
    return TokenArrays.from_table(_inline(records), top_k)


def _inline(records: Mapping[Key, object]) -> pa.Table:
    """The records that carry their logprobs, as token-file rows."""
    rows = [(k, r.logprobs) for k, r in records.items() if getattr(r, "logprobs", None) is not None]
    return pa.Table.from_batches([tokenstore.rows_batch(rows)], schema=tokenstore.SCHEMA)


def _top1(codes: np.ndarray, lp: np.ndarray, arrays: TokenArrays) -> np.ndarray:
    """The top-1 code of each row; ties on the logprob broken by the larger token string. Column by
    column (k elementwise steps): numpy's reductions over a short last axis are slow."""
    best, at = lp[:, 0].copy(), np.zeros(lp.shape[0], dtype=np.intp)
    tied = np.zeros(lp.shape[0], dtype=bool)
    for j in range(1, lp.shape[1]):
        col = lp[:, j]
        above = col > best
        tied = (tied & ~above) | ((col == best) & (codes[:, j] != PAD))
        best = np.where(above, col, best)
        at[above] = j
    top = codes[np.arange(codes.shape[0]), at]
    for i in np.flatnonzero(tied):
        row = np.flatnonzero((lp[i] == lp[i].max()) & (codes[i] != PAD))
        top[i] = max(codes[i][row], key=lambda c: arrays.name(int(c)))
    return top
