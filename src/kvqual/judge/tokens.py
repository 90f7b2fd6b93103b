"""Token-level metrics between two configs: pure functions on top-k logprob maps and token lists.

Teacher forcing gives, at each position, the baseline's and the candidate's top-k maps
{token: logprob} (what OpenAI logprobs return) and the logprob of the scored token.
From these: KL(base‖cand) over the top-k (approximation below), same top-1, Δp and
Δ logprob of the scored token, aggregated per item and by position bucket. Free
generation: first divergence, exact match, repetition loops. See docs/statistics.md.

KL approximation (`topk_kl`): the partition is base's top-k tokens S plus one tail bucket.
  p_i = exp(base logprob), p_tail = max(0, 1 − Σ_S p_i).
  q_i = exp(cand logprob) when i is in cand's top-k. Otherwise q_i is unknown but bounded:
  q_i ≤ q_min (cand's smallest top-k prob, since i ranked below it) and the missing tokens
  M share at most cand's unlisted mass R = 1 − Σ cand top-k. We set
  q_i = min(q_min, R / (|M| + 1)): an equal share of R for each missing token and for the
  rest of the tail, capped by the ranking bound q_min. Taking q_i near its upper bound
  errs toward a smaller KL (a missing token is not assumed to have vanished), and the
  tail bucket keeps mass. q_tail = max(1 − Σ_S q_i, FLOOR).
  KL = Σ_S p_i log(p_i/q_i) + p_tail log(p_tail/q_tail).
With exact q this is KL on a coarsened partition, a lower bound on the full KL (data
processing inequality). So the approximation under-reports: tests/compare/test_tokens.py
checks it against exact KLs (equal when the top-k sets agree; within a few % of the full
KL for peaked distributions with k = 20; docs/statistics.md has the figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

import numpy as np

__all__ = [
    "PROB_FLOOR", "DEFAULT_BUCKETS", "PositionMetrics", "TokenSummary", "BucketSummary",
    "topk_kl", "same_top1", "position_metrics", "summarize_positions", "bucket_by_position",
    "first_divergence", "exact_match", "RepetitionLoop", "repetition_loop", "text_repetition_loop", "distinct_n",
]

PROB_FLOOR = 1e-10  # smallest probability used for an unknown candidate mass (KL ≤ ~23·p)
DEFAULT_BUCKETS = (0, 64, 256, 1024)  # position bucket starts: 0–63, 64–255, 256–1023, 1024+


def topk_kl(base_top: Mapping[str, float], cand_top: Mapping[str, float]) -> float:
    """Approximate KL(base‖cand) in nats from two top-k logprob maps (module docstring)."""
    if not base_top or not cand_top:
        raise ValueError("both top-k maps must be non-empty")
    p = {t: math.exp(lp) for t, lp in base_top.items()}
    q_top = {t: math.exp(lp) for t, lp in cand_top.items()}
    q_min = min(q_top.values())
    unlisted = max(0.0, 1.0 - sum(q_top.values()))
    missing = [t for t in p if t not in q_top]
    guess = max(min(q_min, unlisted / (len(missing) + 1)), PROB_FLOOR)
    kl, q_sum = 0.0, 0.0
    for tok, p_i in p.items():
        q_i = q_top.get(tok, guess)
        q_sum += q_i
        if p_i > 0:
            kl += p_i * math.log(p_i / q_i)
    p_tail = max(0.0, 1.0 - sum(p.values()))
    q_tail = max(1.0 - q_sum, PROB_FLOOR)
    if p_tail > 0:
        kl += p_tail * math.log(p_tail / q_tail)
    return max(kl, 0.0)


def _argmax(top: Mapping[str, float]) -> str:
    # ties broken by token string so the result does not depend on dict order
    return max(top.items(), key=lambda kv: (kv[1], kv[0]))[0]


def same_top1(base_top: Mapping[str, float], cand_top: Mapping[str, float]) -> bool:
    """Whether both configs put the most probability on the same token."""
    return _argmax(base_top) == _argmax(cand_top)


@dataclass(frozen=True)
class PositionMetrics:
    """Metrics at one teacher-forced position: KL, top-1 agreement, Δ of the scored token."""

    kl: float
    same_top1: bool
    delta_p: float  # p_cand(token) − p_base(token)
    delta_logprob: float  # logprob_cand(token) − logprob_base(token)


def position_metrics(
    base_top: Mapping[str, float],
    cand_top: Mapping[str, float],
    base_token_logprob: float,
    cand_token_logprob: float,
) -> PositionMetrics:
    """All per-position metrics for one scored token."""
    return PositionMetrics(
        kl=topk_kl(base_top, cand_top),
        same_top1=same_top1(base_top, cand_top),
        delta_p=math.exp(cand_token_logprob) - math.exp(base_token_logprob),
        delta_logprob=cand_token_logprob - base_token_logprob,
    )


@dataclass(frozen=True)
class TokenSummary:
    """Aggregate of position metrics (an item, a bucket or a whole run)."""

    n_tokens: int
    mean_kl: float
    median_kl: float
    p99_kl: float
    same_top1_rate: float
    rms_delta_p: float
    mean_delta_logprob: float


def summarize_positions(metrics: Sequence[PositionMetrics]) -> TokenSummary:
    """Mean/median/p99 KL, same-top-1 rate, RMS Δp, mean Δ logprob over positions."""
    if not metrics:
        raise ValueError("no positions to summarize")
    kl = np.array([m.kl for m in metrics])
    return TokenSummary(
        n_tokens=len(metrics),
        mean_kl=float(kl.mean()),
        median_kl=float(np.median(kl)),
        p99_kl=float(np.quantile(kl, 0.99)),
        same_top1_rate=float(np.mean([m.same_top1 for m in metrics])),
        rms_delta_p=float(np.sqrt(np.mean([m.delta_p**2 for m in metrics]))),
        mean_delta_logprob=float(np.mean([m.delta_logprob for m in metrics])),
    )


@dataclass(frozen=True)
class BucketSummary:
    """Token metrics for positions in [start, end) (end None: open)."""

    start: int
    end: int | None
    summary: TokenSummary | None  # None when no position fell in the bucket


def bucket_by_position(
    positions: Sequence[int],
    metrics: Sequence[PositionMetrics],
    starts: Sequence[int] = DEFAULT_BUCKETS,
) -> tuple[BucketSummary, ...]:
    """Summaries per position bucket (long-context degradation shows in the late buckets)."""
    if len(positions) != len(metrics):
        raise ValueError("positions and metrics differ in length")
    pos = np.asarray(positions)
    out = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else None
        mask = (pos >= start) & (pos < end if end is not None else True)
        chosen = [m for m, keep in zip(metrics, mask) if keep]
        out.append(BucketSummary(start, end, summarize_positions(chosen) if chosen else None))
    return tuple(out)


# ---------------------------------------------------------------- free generation


def first_divergence(tokens_a: Sequence[Hashable], tokens_b: Sequence[Hashable]) -> int | None:
    """Index of the first differing token (length of the shorter if one is a prefix); None if equal."""
    n = min(len(tokens_a), len(tokens_b))
    for i in range(n):
        if tokens_a[i] != tokens_b[i]:
            return i
    return None if len(tokens_a) == len(tokens_b) else n


def exact_match(tokens_a: Sequence[Hashable], tokens_b: Sequence[Hashable]) -> bool:
    """Whether two outputs are identical token for token (or character for character)."""
    return len(tokens_a) == len(tokens_b) and first_divergence(tokens_a, tokens_b) is None


@dataclass(frozen=True)
class RepetitionLoop:
    """A periodic tail: `period` units repeated `repeats` times over the last `span` units."""

    period: int
    repeats: float
    span: int


def _codes(seq: Sequence[Hashable] | str) -> np.ndarray:
    if isinstance(seq, str):
        return np.frombuffer(seq.encode("utf-32-le"), dtype=np.uint32)
    table: dict[Hashable, int] = {}
    return np.array([table.setdefault(t, len(table)) for t in seq], dtype=np.int64)


TAIL = 16  # positions the vectorized pre-check of `repetition_loop` compares for every period at once


def repetition_loop(
    seq: Sequence[Hashable] | str,
    max_period: int = 64,
    min_repeats: int = 4,
    min_span: int = 32,
) -> RepetitionLoop | None:
    """Detect a degenerate loop: the output ends in a unit of ≤ max_period repeated ≥ min_repeats
    times over ≥ min_span units (defaults in tokens; see docs/statistics.md for the rule)."""
    a = _codes(seq)
    n = a.size
    periods = np.arange(1, min(max_period, n // 2) + 1)
    # a loop of period p needs the last need(p) positions equal to those p before them:
    # span = run + p ≥ min_span and span / p ≥ min_repeats. Checked cheapest first: one
    # vectorized look at the last position over every period, then the survivors' tails.
    need = np.maximum(min_span - periods, (min_repeats - 1) * periods)
    possible = need <= n - periods
    if n and possible.any():  # the last TAIL positions (or need(p), if fewer) against p before them, all periods at once
        tail = min(TAIL, n)
        cols = np.arange(n - tail, n)
        idx = cols[None, :] - periods[:, None]
        eq = a[np.maximum(idx, 0)] == a[cols][None, :]
        checked = cols[None, :] >= n - np.minimum(need, tail)[:, None]
        possible &= ~(checked & ~eq).any(axis=1)
    for period, k in zip(periods[possible].tolist(), need[possible].tolist()):
        if k > 0 and not np.array_equal(a[n - k:], a[n - k - period:n - period]):
            continue
        same = a[period:] == a[:-period]
        mismatches = np.flatnonzero(~same)
        run = same.size if mismatches.size == 0 else same.size - 1 - int(mismatches[-1])
        span = run + period
        if span >= min_span and span / period >= min_repeats:
            return RepetitionLoop(period, span / period, span)
    return None


def text_repetition_loop(text: str) -> RepetitionLoop | None:
    """`repetition_loop` on characters: period ≤ 256 chars, ≥ 4 repeats, span ≥ 128 chars (~32 tokens).

    First a necessary condition at C speed: a loop of period p ends in at least
    max(128 − p, 3p) ≥ 96 characters equal to those p before them, so the last TAIL characters
    occur again, whole, p ≤ 256 characters earlier. Most answers fail it in a microsecond."""
    n = len(text)
    if n < 128:
        return None
    if text.find(text[n - TAIL:], max(0, n - TAIL - 256), n - 1) == -1:
        return None
    return repetition_loop(text, max_period=256, min_repeats=4, min_span=128)


def distinct_n(text: str, n: int = 2) -> float | None:
    """Diversity of one output: distinct word n-grams / all word n-grams (1.0: no n-gram repeats;
    a looping or formulaic output falls towards 0). Words are whitespace-separated; None when the
    output has fewer than n words (too short to say)."""
    words = text.split()
    if len(words) < n:
        return None
    if n == 2:  # the report's distinct-2, on every output of every arm: one pass, no list of grams
        return len(set(zip(words, words[1:]))) / (len(words) - 1)
    return len(set(zip(*(words[i:] for i in range(n))))) / (len(words) - n + 1)
