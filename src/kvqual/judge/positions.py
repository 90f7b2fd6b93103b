"""Token-level metrics vectorized over positions: the judge's fast path at scale.

`tokens.py` defines the metrics one position at a time (the reference, and what the tests check
against exact KLs); this module computes the same numbers over every position of many items at
once with numpy, from the columnar token files (`tokenstore.py`):

* `TokenArrays` (judge/tokenarrays.py, its names here too): one file's per-token data as flat
  arrays of int64 *codes*, so comparisons never touch Python strings.
* `compare_forced`: the per-position KL (`tokens.topk_kl`'s approximation), same-top-1, Δp and
  Δ logprob of two teacher-forced files over the pairs whose tokens agree, computed in chunks
  so memory stays bounded, with per-item means for the gate.
* `reproduced`: whether a second teacher-forcing pass is bit-identical to the first.

Top-1 ties (two alternatives with the same logprob) are broken by token string, as
`tokens.same_top1` does; those positions (rare) are resolved one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from kvqual import tokenstore
from kvqual.judge.tokenarrays import (  # noqa: F401 - re-exported: `pos.load`, `pos.from_logprobs`, `pos.PAD`
    CHUNK, PAD, Key, TokenArrays, _top1, from_logprobs, load)
from kvqual.judge.tokens import PROB_FLOOR


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
