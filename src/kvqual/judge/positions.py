"""Token-level metrics vectorized over positions: the judge's fast path at scale.

`tokens.py` defines the metrics one position at a time (the reference, and what the tests check
against exact KLs); this module computes the same numbers over every position of many items at
once with numpy, from the columnar token files (`tokenstore.py`):

* `TokenArrays`: one file's per-token data as flat arrays. Row r's positions are
  `starts[r]:starts[r+1]`; tokens and top-k entries are int64 *codes* — a token id is its own
  code, any other string a negative code from its hash (equal strings, equal codes, within one
  process), so comparisons never touch Python strings.
* `compare_forced`: the per-position KL (`tokens.topk_kl`'s approximation), same-top-1, Δp and
  Δ logprob of two teacher-forced files over the pairs whose tokens agree, computed in chunks
  so memory stays bounded, with per-item means for the gate.
* `reproduced`: whether a second teacher-forcing pass is bit-identical to the first.

Top-1 ties (two alternatives with the same logprob) are broken by token string, as
`tokens.same_top1` does; those positions (rare) are resolved one by one.
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
from kvqual.judge.tokens import PROB_FLOOR

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


def _gather(starts: np.ndarray, rows: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Flat position indices of `rows`, the first `lengths[i]` positions of each."""
    total = int(lengths.sum())
    seg = np.repeat(np.arange(rows.size), lengths)
    within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return starts[rows][seg] + within


def first_divergence(a: np.ndarray, b: np.ndarray) -> int | None:
    """`tokens.first_divergence` on code arrays."""
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    if diff.size:
        return int(diff[0])
    return None if a.size == b.size else n


def first_divergences(a: TokenArrays, b: TokenArrays, keys: Sequence[Key]) -> list[int | None]:
    """`first_divergence` of each key's rows in `a` and `b` (every key in both), a chunk of pairs
    at a time: one comparison over their common positions instead of a few numpy calls a pair."""
    out: list[int | None] = []
    if not keys:
        return out
    ra, rb = a.rows(keys), b.rows(keys)
    la, lb = a.lengths(ra), b.lengths(rb)
    n = np.minimum(la, lb)
    for lo, hi in _pair_chunks(n):
        m = n[lo:hi]
        differs = a.tokens[_gather(a.starts, ra[lo:hi], m)] != b.tokens[_gather(b.starts, rb[lo:hi], m)]
        at = np.flatnonzero(differs)  # flat positions that differ, in pair order
        seg = np.zeros(m.size + 1, dtype=np.int64)
        np.cumsum(m, out=seg[1:])
        first = np.searchsorted(at, seg[:-1])  # each pair's first differing flat position, if inside it
        found = first < at.size
        found[found] = at[first[found]] < seg[1:][found]
        offset = np.zeros(m.size, dtype=np.int64)
        offset[found] = at[first[found]] - seg[:-1][found]
        for f, d, x, y, k in zip(found.tolist(), offset.tolist(), la[lo:hi].tolist(), lb[lo:hi].tolist(), m.tolist()):
            out.append(d if f else (None if x == y else k))
    return out


def topk_kl(bc: np.ndarray, bl: np.ndarray, cc: np.ndarray, cl: np.ndarray) -> np.ndarray:
    """`tokens.topk_kl` for every row of (n, k) code and logprob arrays (PAD / -inf where empty).
    Rows whose two top-k lists hold the same tokens in the same order (most positions of two close
    configs) take the short path: every q_i is listed, so p_i·log(p_i/q_i) = p_i·(lb_i − lc_i)."""
    k = max(bc.shape[1], cc.shape[1])
    codes = np.result_type(bc, cc)  # a teacher file's ids and a generation file's codes may be stored narrower
    bc, cc = _pad(bc.astype(codes, copy=False), k, PAD), _pad(cc.astype(codes, copy=False), k, PAD)
    bl, cl = _pad(bl, k, -np.inf), _pad(cl, k, -np.inf)
    ones = np.ones(k)  # row sums as a matrix-vector product: numpy's sum over a short last axis is slow
    lb, lc = bl.astype(np.float64), cl.astype(np.float64)
    p, q_top = np.exp(lb), np.exp(lc)  # 0 at PAD (logprob -inf)
    p_tail = np.maximum(0.0, 1.0 - p @ ones)
    with np.errstate(invalid="ignore"):
        d = lb - lc
    d[bc == PAD] = 0.0
    kl = (p * d) @ ones  # right wherever both lists are the same tokens in the same order
    q_sum = q_top @ ones
    rest = np.flatnonzero(_rows(bc) != _rows(cc))
    if rest.size:
        kl[rest], q_sum[rest] = _kl_matched(bc[rest], p[rest], cc[rest], q_top[rest])
    q_tail = np.maximum(1.0 - q_sum, PROB_FLOOR)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = np.where(p_tail > 0, p_tail * np.log(np.where(p_tail > 0, p_tail, 1.0) / q_tail), 0.0)
    return np.maximum(kl + tail, 0.0)


def _rows(x: np.ndarray) -> np.ndarray:
    """Each row of a 2-D array as one opaque value, so whole rows compare in one operation."""
    x = np.ascontiguousarray(x)
    return x.view(np.dtype((np.void, x.dtype.itemsize * x.shape[1]))).ravel()


def _kl_matched(bc: np.ndarray, p: np.ndarray, cc: np.ndarray, q_top: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The listed part of the KL and Σ q_i where the two lists differ: each base token's q from the
    candidate's list where it is there, else the bounded guess (tokens.py's module docstring)."""
    vb, vc = bc != PAD, cc != PAD
    ones = np.ones(bc.shape[1])
    q_min = np.where(vc, q_top, np.inf).min(axis=1)
    unlisted = np.maximum(0.0, 1.0 - q_top @ ones)
    has = np.zeros(bc.shape, dtype=bool)
    q = np.zeros(bc.shape)
    for j in range(cc.shape[1]):  # one candidate slot at a time: (m, k) arrays, not an (m, k, k) match
        eq = (bc == cc[:, j:j + 1]) & vb & vc[:, j:j + 1]
        has |= eq
        np.add(q, q_top[:, j:j + 1], out=q, where=eq)
    missing = (vb & ~has) @ ones
    guess = np.maximum(np.minimum(q_min, unlisted / (missing + 1)), PROB_FLOOR)
    q = np.where(has, q, guess[:, None])
    q[~vb] = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(vb & (p > 0), p * np.log(p / q), 0.0) @ ones
    return kl, q @ ones


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


@dataclass
class PairPositions:
    """Per-position metrics of two teacher-forced files over the pairs whose tokens agree."""

    keys: list[Key]  # pairs compared, in order
    starts: np.ndarray  # len(keys) + 1 offsets into the position arrays
    kl: np.ndarray
    same_top1: np.ndarray
    delta_p: np.ndarray
    delta_logprob: np.ndarray
    position: np.ndarray  # index of each position within its item
    differ: set[Key]  # pairs left out: the two files scored different tokens

    def mean(self, values: np.ndarray) -> np.ndarray:
        """Per pair mean of a per-position array."""
        lengths = np.diff(self.starts)
        if not lengths.size:
            return np.zeros(0)
        return np.add.reduceat(values.astype(np.float64), self.starts[:-1]) / lengths

    def select(self, keys: set[Key]) -> np.ndarray:
        """A position mask for the pairs in `keys`."""
        chosen = np.fromiter((k in keys for k in self.keys), dtype=bool, count=len(self.keys))
        return np.repeat(chosen, np.diff(self.starts))


def compare_forced(a: TokenArrays, b: TokenArrays, keys: Sequence[Key]) -> PairPositions:
    """KL(a‖b), same top-1, Δp = p_b − p_a and Δ logprob of the scored token at every position of
    the pairs in `keys` (present in both) whose token sequences are identical."""
    keys = [k for k in keys if k in a.index and k in b.index]
    ra, rb = a.rows(keys), b.rows(keys)
    la, lb = a.lengths(ra), b.lengths(rb)
    same_len = (la == lb) & a.top_ok[ra] & b.top_ok[rb] if keys else np.zeros(0, bool)
    n = np.where(same_len, la, 0)
    # which pairs agree token for token, a chunk of pairs at a time (no index arrays over every position)
    agree = np.zeros(len(keys), dtype=bool)
    for lo, hi in _pair_chunks(n):
        m = n[lo:hi]
        same = a.tokens[_gather(a.starts, ra[lo:hi], m)] == b.tokens[_gather(b.starts, rb[lo:hi], m)]
        agree[lo:hi] = tokenstore.all_per_segment(same, m)
    agree &= same_len & (la > 0)
    differ = {k for k, ok in zip(keys, agree) if not ok}
    kept = [k for k, ok in zip(keys, agree) if ok]
    lengths = n[agree]
    ra, rb = ra[agree], rb[agree]
    starts = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    total = int(starts[-1])
    kl = np.empty(total)
    same = np.empty(total, dtype=bool)
    delta_p = np.empty(total, dtype=np.float32)
    delta_lp = np.empty(total, dtype=np.float32)
    position = np.empty(total, dtype=np.int32)
    top1_a = a.top1() if total else None
    for lo, hi in _pair_chunks(lengths):  # every per-position figure is elementwise: chunks change no bit
        s, e = int(starts[lo]), int(starts[hi])
        m = lengths[lo:hi]
        xa, xb = _gather(a.starts, ra[lo:hi], m), _gather(b.starts, rb[lo:hi], m)
        bc, bl = b.top_codes[xb], b.top_lp[xb]
        kl[s:e] = topk_kl(a.top_codes[xa], a.top_lp[xa], bc, bl)
        same[s:e] = top1_a[xa] == _top1(bc, bl, b)
        lp_a, lp_b = a.logprob[xa], b.logprob[xb]
        delta_p[s:e] = np.exp(lp_b) - np.exp(lp_a)
        delta_lp[s:e] = lp_b - lp_a
        position[s:e] = np.arange(s, e) - np.repeat(starts[lo:hi], m)
    return PairPositions(kept, starts, kl, same, delta_p, delta_lp, position, differ)


def _pair_chunks(lengths: np.ndarray) -> Iterable[tuple[int, int]]:
    """Consecutive ranges of pairs [lo, hi) of about CHUNK positions each (a longer pair alone)."""
    ends = np.cumsum(lengths)
    lo = 0
    while lo < lengths.size:
        done = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, done + CHUNK, side="right")))
        yield lo, hi
        lo = hi


def kl_upto(a: TokenArrays, b: TokenArrays, upto: Mapping[Key, int]) -> dict[Key, float]:
    """Per key, the mean KL(a‖b) over its first `upto[key]` positions, where both files hold that
    many positions with top-k lists and the same tokens before the last of them (the last may
    differ: what is compared there is the distribution, whose context is the tokens before it);
    other keys are left out. The cache probe compares a teacher-forced file with a generation file
    this way, up to and including the first token where two outputs part (docs/cache.md)."""
    keys = [k for k, n in upto.items() if n > 0 and k in a.index and k in b.index]
    ra, rb = a.rows(keys), b.rows(keys)
    want = np.fromiter((upto[k] for k in keys), dtype=np.int64, count=len(keys))
    ok = (a.lengths(ra) >= want) & (b.lengths(rb) >= want) & a.top_ok[ra] & b.top_ok[rb] if keys else np.zeros(0, bool)
    n = np.where(ok, want, 0)
    ia, ib = _gather(a.starts, ra, n), _gather(b.starts, rb, n)
    last = np.zeros(ia.size, dtype=bool)
    last[np.cumsum(n)[n > 0] - 1] = True  # each key's last compared position: its token may differ
    ok &= tokenstore.all_per_segment((a.tokens[ia] == b.tokens[ib]) | last, n)
    kl = topk_kl(a.top_codes[ia], a.top_lp[ia], b.top_codes[ib], b.top_lp[ib]) if ia.size else np.zeros(0)
    starts = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(n, out=starts[1:])
    return {k: float(kl[starts[i]:starts[i + 1]].mean()) for i, k in enumerate(keys) if ok[i]}


def reproduced(a: TokenArrays, b: TokenArrays, keys: Sequence[Key]) -> dict[Key, bool]:
    """Per pair present in both: tokens, scored logprobs and top-k (codes and logprobs, in order)
    identical bit for bit."""
    keys = [k for k in keys if k in a.index and k in b.index]
    ra, rb = a.rows(keys), b.rows(keys)
    la, lb = a.lengths(ra), b.lengths(rb)
    n = np.where(la == lb, la, 0)
    ia, ib = _gather(a.starts, ra, n), _gather(b.starts, rb, n)
    same = (a.tokens[ia] == b.tokens[ib])
    same &= (a.logprob[ia] == b.logprob[ib]) | (np.isnan(a.logprob[ia]) & np.isnan(b.logprob[ib]))
    k = max(a.top_codes.shape[1], b.top_codes.shape[1])
    same &= (_pad(a.top_codes[ia], k, PAD) == _pad(b.top_codes[ib], k, PAD)).all(axis=1)
    same &= (_pad(a.top_lp[ia], k, -np.inf) == _pad(b.top_lp[ib], k, -np.inf)).all(axis=1)
    ok = tokenstore.all_per_segment(same, n) & (la == lb)
    return dict(zip(keys, ok.tolist()))


def all_reproduced(a: TokenArrays, b: TokenArrays, keys: Sequence[Key]) -> bool:
    """`all(reproduced(a, b, keys).values())`, a chunk of pairs at a time (cache-sized temporaries,
    never a copy of both passes' top-k) and stopping at the first pair that differs: a second
    teacher-forcing pass that is not bit-identical is told by its first chunk."""
    keys = [k for k in keys if k in a.index and k in b.index]
    if not keys:
        return True
    ra, rb = a.rows(keys), b.rows(keys)
    la, lb = a.lengths(ra), b.lengths(rb)
    if not np.array_equal(la, lb):
        return False
    k = max(a.top_codes.shape[1], b.top_codes.shape[1])
    ends = np.cumsum(la)
    lo = 0
    while lo < len(keys):
        done = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, done + CHUNK, side="right")))
        ia, ib = _gather(a.starts, ra[lo:hi], la[lo:hi]), _gather(b.starts, rb[lo:hi], la[lo:hi])
        xa, xb = a.logprob[ia], b.logprob[ib]
        if not (np.array_equal(a.tokens[ia], b.tokens[ib])
                and ((xa == xb) | (np.isnan(xa) & np.isnan(xb))).all()
                and np.array_equal(_pad(a.top_codes[ia], k, PAD), _pad(b.top_codes[ib], k, PAD))
                and (_pad(a.top_lp[ia], k, -np.inf) == _pad(b.top_lp[ib], k, -np.inf)).all()):
            return False
        lo = hi
    return True


def _pad(x: np.ndarray, k: int, fill: float) -> np.ndarray:
    if x.shape[1] == k:
        return x
    out = np.full((x.shape[0], k), fill, dtype=x.dtype)
    out[:, : x.shape[1]] = x
    return out
