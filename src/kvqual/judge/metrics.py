"""Two saved runs (+ the A/A replicate and teacher-forced files) → metrics and gate inputs.

Pairs are joined by (suite, item id, repeat), never by position, and clustered by item (or
shared context): repeats of an item are one independent unit. A pair where either side
failed is dropped from quality metrics and counted in `dropped_pairs`; failures stay
visible in the reliability section and in the failed-rate criteria.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from kvqual.judge import positions as pos
from kvqual import stats as st
from kvqual.judge import tokens as tk
from kvqual.forced import FAILED, Forced, load_forced
from kvqual.gate import (AccuracyPairs, CachePairs, GateInputs, LengthPairs, RatePairs, RequestCounts,
                         TokenCoverage, TokenPairs)
from kvqual.gate.criteria import CONTEXT_PREFIX
from kvqual.records import Sample, refused_limit

Key = tuple[str, str, int]
Diversity = tuple[Mapping[Key, float | None], Mapping[Key, float | None], Mapping[Key, float | None]]  # distinct-2 by arm
OVERALL = "overall"


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


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), nd)


def _ci(interval: Any) -> list[float | None]:
    return [_r(interval.low), _r(interval.high)]


def task_metrics(pairs: list[tuple[Sample, Sample]]) -> dict[str, Any] | None:
    scored = [(a, b) for a, b in pairs if a.score is not None and b.score is not None]
    if not scored:
        return None
    base = np.array([a.score >= 0.5 for a, _ in scored])
    cand = np.array([b.score >= 0.5 for _, b in scored])
    counts = st.paired_counts(base, cand)
    return {
        "n": counts.n,
        "acc_base": _r(base.mean()), "acc_base_ci": _ci(st.wilson_ci(int(base.sum()), base.size)),
        "acc_cand": _r(cand.mean()), "acc_cand_ci": _ci(st.wilson_ci(int(cand.sum()), cand.size)),
        "diff": _r(counts.difference), "diff_ci": _ci(st.newcombe_ci(counts)),
        "flips_right_to_wrong": counts.b, "flips_wrong_to_right": counts.c,
        "mcnemar_p": _r(st.mcnemar_exact_p(counts.b, counts.c)),
    }


def divergence(a: Sample, b: Sample, ta: pos.TokenArrays | None = None, tb: pos.TokenArrays | None = None) -> int | None:
    """First differing token of two outputs, on their token codes where both arms have them,
    else on their tokens where both came in the same form (both as ids or both as strings),
    else on characters: an id and a string never compare equal."""
    if ta is not None and tb is not None and a.key in ta.index and b.key in tb.index:
        return pos.first_divergence(ta.tokens_of(a.key), tb.tokens_of(b.key))
    la, lb = a.logprobs, b.logprobs
    if la is not None and lb is not None and (la.token_ids is None) == (lb.token_ids is None):
        return tk.first_divergence(la.tokens, lb.tokens)
    return tk.first_divergence(a.text or "", b.text or "")


def divergences(pairs: list[tuple[Sample, Sample]], ta: pos.TokenArrays | None,
                tb: pos.TokenArrays | None) -> dict[Key, int | None]:
    """`divergence` of every pair, by the baseline's key: on token codes in one vectorized pass
    where both arms have them (`pos.first_divergences`), else one pair at a time."""
    out: dict[Key, int | None] = {}
    coded = [] if ta is None or tb is None else [(a, b) for a, b in pairs if a.key in ta.index and b.key in tb.index]
    if coded:
        found = pos.first_divergences(ta, tb, [a.key for a, _ in coded])
        by_b = dict(zip((b.key for _, b in coded), found))  # a pair's two keys are the same key
        for a, b in pairs:
            out[a.key] = by_b[b.key] if b.key in by_b else divergence(a, b, ta, tb)
        return out
    return {a.key: divergence(a, b, ta, tb) for a, b in pairs}


def _looping(s: Sample, known: Mapping[Key, bool] | None) -> bool:
    if known is not None and s.key in known:
        return known[s.key]
    return tk.text_repetition_loop(s.text or "") is not None


LENGTH_QUANTILES = (50, 90, 99)


def distinct2(samples: Mapping[Key, Sample], memo: dict[str, float | None] | None = None) -> dict[Key, float | None]:
    """distinct-2 of each answered sample's output (computed once per sample: every suite's and
    the overall section's generation metrics read it, the baseline's in both A/B and A/A).
    `memo`: text → distinct-2, shared by the arms, so an output that is the same in two arms
    (most A/A replicates, many candidates) is counted once."""
    memo = {} if memo is None else memo
    out: dict[Key, float | None] = {}
    for k, s in samples.items():
        if s.ok:
            text = s.text or ""
            if text not in memo:
                memo[text] = tk.distinct_n(text)
            out[k] = memo[text]
    return out


def _diversity(pairs: list[tuple[Sample, Sample]],
               known: tuple[Mapping[Key, float | None], Mapping[Key, float | None]] | None = None) -> dict[str, Any]:
    """Mean distinct-2 (distinct word bigrams / all bigrams per output) of each arm over the pairs
    where both outputs have two words or more, and the paired difference cand − base with a t CI.
    `known`: each arm's distinct-2 by key (`distinct2`), where the caller has them."""
    if known is None:
        memo: dict[str, float | None] = {}
        known = (distinct2({a.key: a for a, _ in pairs}, memo), distinct2({b.key: b for _, b in pairs}, memo))
    da, db = known
    both = [(x, y) for x, y in ((da[a.key], db[b.key]) for a, b in pairs) if x is not None and y is not None]
    out: dict[str, Any] = {"distinct2_base": None, "distinct2_cand": None, "distinct2_diff": None,
                           "distinct2_diff_ci": [None, None], "distinct2_n": len(both)}
    if len(both) >= 2:
        x, y = np.array(both).T
        d = st.paired_mean_diff(x, y)
        out.update(distinct2_base=_r(float(x.mean())), distinct2_cand=_r(float(y.mean())),
                   distinct2_diff=_r(d.estimate), distinct2_diff_ci=[_r(d.low), _r(d.high)])
    return out


def generation_metrics(pairs: list[tuple[Sample, Sample]], loops_a: Mapping[Key, bool] | None = None,
                       loops_b: Mapping[Key, bool] | None = None,
                       div: list[int | None] | None = None,
                       diversity: tuple[Mapping[Key, float | None], Mapping[Key, float | None]] | None = None,
                       ) -> dict[str, Any] | None:
    """`div`: the pairs' first divergences, `diversity`: each arm's distinct-2 by key (`distinct2`),
    where the caller has them already."""
    if not pairs:
        return None
    lb = np.array([a.completion_tokens or 0 for a, _ in pairs], dtype=float)
    lc = np.array([b.completion_tokens or 0 for _, b in pairs], dtype=float)
    div = div if div is not None else [divergence(a, b) for a, b in pairs]
    diverged = [d for d in div if d is not None]
    out: dict[str, Any] = {
        "n": len(pairs),
        "exact_rate": _r(np.mean([a.text == b.text for a, b in pairs])),
        "first_div_median": _r(float(np.median(diverged))) if diverged else None,
        "diverge_within_16": _r(np.mean([d is not None and d < 16 for d in div])),
        "len_base_mean": _r(lb.mean()), "len_cand_mean": _r(lc.mean()),
        "len_ratio": None, "len_ratio_ci": [None, None], "wilcoxon_p": None, "hl_shift": None,
        "hl_ci": [None, None], "ks_stat": None, "ks_p": None,
        "trunc_base": _r(np.mean([a.finish_reason == "length" for a, _ in pairs])),
        "trunc_cand": _r(np.mean([b.finish_reason == "length" for _, b in pairs])),
        "loops_base": _r(np.mean([_looping(a, loops_a) for a, _ in pairs])),
        "loops_cand": _r(np.mean([_looping(b, loops_b) for _, b in pairs])),
        # the length distribution's upper part (where runaway outputs show), and diversity
        **{f"len_{arm}_p{q}": _r(float(np.percentile(v, q))) for q in LENGTH_QUANTILES for arm, v in
           (("base", lb), ("cand", lc))},
        **_diversity(pairs, diversity),
    }
    if lb.sum() > 0 and len(pairs) >= 2:
        ratio, _ = st.ratio_of_means_ci(lb, lc)
        out.update(len_ratio=_r(ratio.estimate), len_ratio_ci=_ci(ratio))
        hl = st.hodges_lehmann(lc - lb)
        out.update(hl_shift=_r(hl.estimate), hl_ci=_ci(hl))
        ks = st.ks_two_sample(lb, lc)
        out.update(ks_stat=_r(ks.statistic), ks_p=_r(ks.pvalue))
        if np.any(lc != lb):
            out["wilcoxon_p"] = _r(st.wilcoxon_signed_rank(lb, lc).pvalue)
    return out


def usable(forcing: Forcing, key: Key) -> bool:
    f = forcing.records.get(key)
    return f is not None and f.aligned and key in forcing.arrays.index


def same_windows(ref: Forcing, other: Forcing, key: Key) -> bool:
    """Both passes scored the item's completion in the same windows (or both in one request): a
    token scored with less context in one pass than in the other is not a like-for-like pair."""
    a, b = ref.records.get(key), other.records.get(key)
    return a is not None and b is not None and a.chunks == b.chunks


WINDOWS_DIFFER = "scored in different windows (the servers admit different prompt lengths)"


def forced_pairs(ref: Forcing, other: Forcing, keys: list[Key]) -> pos.PairPositions:
    """Position metrics KL(ref‖other) over the pairs of `keys` both passes scored on the same tokens
    in the same windows."""
    return pos.compare_forced(ref.arrays, other.arrays, [k for k in keys if usable(ref, k) and usable(other, k)
                                                         and same_windows(ref, other, k)])


def token_metrics(pp: pos.PairPositions | None, keys: list[Key], n_keys: int) -> dict[str, Any] | None:
    """Summaries over the positions of the pairs in `keys` (a suite, or all, of `n_keys` items;
    those not compared count as misaligned)."""
    if pp is None:
        return None
    chosen = set(keys)
    n_items = sum(1 for k in pp.keys if k in chosen)
    if not n_items:
        return None
    mask = pp.select(chosen) if n_items < len(pp.keys) else slice(None)
    kl, same = pp.kl[mask], pp.same_top1[mask]
    dp, dlp, where = pp.delta_p[mask].astype(np.float64), pp.delta_logprob[mask].astype(np.float64), pp.position[mask]
    buckets = []
    for i, start in enumerate(tk.DEFAULT_BUCKETS):
        end = tk.DEFAULT_BUCKETS[i + 1] if i + 1 < len(tk.DEFAULT_BUCKETS) else None
        m = (where >= start) & (where < end if end is not None else True)
        n = int(m.sum())
        buckets.append({"start": start, "end": end, "n_tokens": n, "mean_kl": _r(kl[m].mean()) if n else None,
                        "same_top1_rate": _r(same[m].mean()) if n else None})
    return {"n_items": n_items, "n_tokens": int(kl.size), "misaligned": n_keys - n_items,
            "mean_kl": _r(kl.mean()), "median_kl": _r(float(np.median(kl))), "p99_kl": _r(float(np.quantile(kl, 0.99))),
            "same_top1_rate": _r(same.mean()), "rms_delta_p": _r(float(np.sqrt(np.mean(dp**2)))),
            "mean_delta_logprob": _r(dlp.mean()), "by_position": buckets}


def _pairs(a: Mapping[Key, Sample], b: Mapping[Key, Sample], keys: list[Key]) -> tuple[list[tuple[Sample, Sample]], int]:
    good = [(a[k], b[k]) for k in keys if k in a and k in b and a[k].ok and b[k].ok]
    return good, len(keys) - len(good)


def cluster_id(s: Sample) -> str:
    """The independent unit a sample belongs to: its shared context, else what it sent (items with
    the same prompt, and the repeats of an item, are one cluster), else its item (runs written before
    prompts were hashed). Prefixes let the gate say "contexts" or "items" (gate/criteria.py)."""
    if s.context_id:
        return f"{CONTEXT_PREFIX}{s.context_id}"
    return f"prompt:{s.prompt_hash}" if s.prompt_hash else f"item:{s.suite}\x00{s.id}"


def _clusters(samples: list[Sample]) -> np.ndarray:
    return np.array([cluster_id(s) for s in samples], dtype=object)


def floor_reproduced(base: Forcing, again: Forcing) -> bool:
    """The second teacher-forcing pass reproduced the first bit for bit on every item it covered."""
    both = [k for k in again.records if k in base.records]
    if not both or not all(usable(base, k) and usable(again, k) for k in both):
        return False
    return pos.all_reproduced(base.arrays, again.arrays, both)


MIN_REPRODUCED = 8  # items a bit-identical second pass must cover before its floor (0) is extended to all


def loop_flags(samples: Mapping[Key, Sample]) -> dict[Key, bool]:
    """Whether each answered sample ends in a repetition loop (computed once per sample)."""
    return {k: tk.text_repetition_loop(s.text or "") is not None for k, s in samples.items() if s.ok}


CACHE_PROBE_SUITES = frozenset({"shared_prefix"})  # suites built to probe the cache path (docs/cache.md)


WARM_SHARE, COLD_SHARE = 0.5, 0.1  # cached share of the prompt: at least → warm, at most → cold


def cache_state(s: Sample) -> bool | None:
    """Warm (True), cold (False) or neither (None) by the share of its prompt the server said it
    served from its prefix cache. Not "any hit": every prompt after the first shares the chat
    template's few blocks with every other (32 of ~1,000 tokens on the probe's), so a unit is warm
    when most of its prompt came from cache and cold when almost none did; between, it is left out."""
    if not s.ok or not s.context_id or s.cached_tokens is None:
        return None
    if not s.prompt_tokens:
        return s.cached_tokens > 0
    share = s.cached_tokens / s.prompt_tokens
    return True if share >= WARM_SHARE else False if share <= COLD_SHARE else None


def cache_states(samples: Mapping[Key, Sample]) -> dict[Key, bool]:
    """The answered units on shared contexts that were clearly warm (True) or cold (False)."""
    states = {k: cache_state(s) for k, s in samples.items()}
    return {k: v for k, v in states.items() if v is not None}


@dataclass(frozen=True)
class CacheEvidence:
    """The cache-path probe's per-unit comparisons (docs/cache.md): on each unit of a shared context
    the candidate reported as warm or cold, the mean KL between the candidate's teacher-forced (cold:
    echo never reads the cache) and generated (warm or cold) distributions over the outputs' common
    prefix, minus the same on the baseline."""

    warm: dict[Key, bool]  # the candidate's units: served from its cache or not
    cand_kl: dict[Key, float]  # KL(cand forced ‖ cand generated) over the common prefix
    base_kl: dict[Key, float]  # KL(base forced ‖ base generated) over the same positions
    exact: dict[Key, bool]  # the candidate's output equals the baseline's


def cache_evidence(base: Arm, cand: Arm, keys: list[Key]) -> CacheEvidence | None:
    """The probe's comparisons over `keys`, or None where the candidate reported no warm unit (or the
    arms cannot read their generation top-k). Reads both arms' generation top-k once."""
    states = cache_states({k: cand.samples[k] for k in keys if k in cand.samples})
    if not any(states.values()) or base.topk is None or cand.topk is None or base.tokens is None or cand.tokens is None:
        return None
    upto: dict[Key, int] = {}
    exact: dict[Key, bool] = {}
    for k in states:
        b, c = base.samples.get(k), cand.samples[k]
        if b is None or not b.ok or k not in base.tokens.index or k not in cand.tokens.index:
            continue
        tb, tc = base.tokens.tokens_of(k), cand.tokens.tokens_of(k)
        d = pos.first_divergence(tb, tc)
        n = min(tb.size, tc.size)
        exact[k] = d is None
        upto[k] = n if d is None else min(d + 1, n)  # at the first differing token the contexts still agree
    base_top, cand_top = base.topk(), cand.topk()
    forced_b = {k: n for k, n in upto.items() if usable(base.forced, k)}
    forced_c = {k: n for k, n in upto.items() if usable(cand.forced, k)}
    base_kl = pos.kl_upto(base.forced.arrays, base_top, forced_b)
    cand_kl = pos.kl_upto(cand.forced.arrays, cand_top, forced_c)
    return CacheEvidence({k: states[k] for k in upto}, cand_kl, base_kl, exact)


def cache_pairs(ev: CacheEvidence | None, base: Arm, cand: Arm, keys: list[Key]) -> CachePairs | None:
    """The gate's cache-path input over `keys`; None when the compare holds no probe (no warm unit
    reported and no probe suite)."""
    probe = any(k[0] in CACHE_PROBE_SUITES for k in keys)
    role = "primary" if probe else "guard"
    chosen = set(keys)
    if ev is None or not any(w for k, w in ev.warm.items() if k in chosen):
        if not probe:
            return None
        reported = any(cand.samples[k].cached_tokens is not None for k in keys if k in cand.samples)
        why = ("no request of the candidate was served from its prefix cache" if reported else
               "the candidate does not report cached prompt tokens (vLLM: --enable-prompt-tokens-details; "
               "SGLang: --enable-cache-report)")
        return CachePairs([], [], [], role=role, note=why)
    rows = [k for k in sorted(chosen) if k in ev.warm and k in ev.cand_kl and k in ev.base_kl]
    warm = [ev.warm[k] for k in rows]
    n_warm, n_cold = sum(warm), len(warm) - sum(warm)
    exact_w = [ev.exact[k] for k in rows if ev.warm[k]]
    exact_c = [ev.exact[k] for k in rows if not ev.warm[k]]
    note = (f"{n_warm} warm and {n_cold} cold units; same output as the baseline: warm "
            f"{np.mean(exact_w):.0%}" if exact_w else f"{n_warm} warm and {n_cold} cold units")
    if exact_c:
        note += f", cold {np.mean(exact_c):.0%}"
    return CachePairs([ev.cand_kl[k] - ev.base_kl[k] for k in rows], warm,
                      _clusters([cand.samples[k] for k in rows]), role=role, note=note)


@dataclass(frozen=True)
class TokenEvidence:
    """The teacher-forced comparisons a judge computes once, which every look then reuses."""

    ab: pos.PairPositions  # the baseline's completions scored by the baseline vs by the candidate
    aa: pos.PairPositions | None  # by the baseline vs by the baseline again (the A/A floor)
    reproduced: bool  # the second pass reproduced the first bit for bit (on enough items)
    again: Mapping[Key, Forced]
    ab_means: dict[Key, tuple[float, float]]  # per pair: mean KL, mean same-top-1
    aa_means: dict[Key, tuple[float, float]]
    cache: CacheEvidence | None = None  # the cache-path probe, where the candidate reported warm units


def _means(pp: pos.PairPositions | None) -> dict[Key, tuple[float, float]]:
    if pp is None:
        return {}
    return dict(zip(pp.keys, zip(pp.mean(pp.kl).tolist(), pp.mean(pp.same_top1).tolist())))


def token_evidence(base: Arm, cand: Arm, again: Forcing | None, keys: list[Key]) -> TokenEvidence:
    """Both comparisons (and the cache probe's), each pass's arrays released once it is no longer needed."""
    ab = forced_pairs(base.forced, cand.forced, keys)
    cache = cache_evidence(base, cand, keys)
    cand.forced.arrays.release()
    aa = forced_pairs(base.forced, again, keys) if again is not None and again.records else None
    reproduced = again is not None and floor_reproduced(base.forced, again) and len(again.records) >= MIN_REPRODUCED
    for forcing in (again, base.forced):
        if forcing is not None:
            forcing.arrays.release()
    return TokenEvidence(ab, aa, reproduced, again.records if again is not None else {}, _means(ab), _means(aa),
                         cache)


def gate_inputs(base: Arm, cand: Arm, aa: Arm | None, base_forced_again: Forcing | None,
                keys: list[Key], teacher_forcing: bool = True,
                loops: tuple[Mapping[Key, bool], Mapping[Key, bool], Mapping[Key, bool]] | None = None,
                evidence: TokenEvidence | None = None, diversity: Diversity | None = None) -> GateInputs:
    """The gate's inputs over `keys` (every unit judged at one look): paired by key, clustered by
    item. `evidence`: the teacher-forced comparisons over all keys, `loops` and `diversity` each
    arm's loop flags and distinct-2 by key, where the caller has them."""
    loops = loops or (loop_flags(base.samples), loop_flags(cand.samples), loop_flags(aa.samples) if aa else {})
    diversity = diversity or diversities(base, cand, aa)
    unfit = does_not_fit(base, cand, aa)
    keys = [k for k in keys if (k[0], k[1]) not in unfit]  # left out of every arm, neither answer nor failure
    suites = sorted({k[0] for k in keys})
    ab_all, _ = _pairs(base.samples, cand.samples, keys)
    aa_keys = [k for k in keys if aa is not None and k in aa.samples]
    aa_all, _ = _pairs(base.samples, aa.samples, aa_keys) if aa is not None else ([], 0)
    accuracy = []
    for suite in suites:
        scored = [(a, b) for a, b in ab_all if a.suite == suite and a.score is not None and b.score is not None]
        if scored:
            accuracy.append(AccuracyPairs(suite, [a.score >= 0.5 for a, _ in scored],
                                          [b.score >= 0.5 for _, b in scored], _clusters([a for a, _ in scored])))
    lengths = LengthPairs([a.completion_tokens or 0 for a, _ in ab_all], [b.completion_tokens or 0 for _, b in ab_all],
                          _clusters([a for a, _ in ab_all])) if len(ab_all) >= 2 else None
    floor = LengthPairs([a.completion_tokens or 0 for a, _ in aa_all], [b.completion_tokens or 0 for _, b in aa_all],
                        _clusters([a for a, _ in aa_all])) if len(aa_all) >= 2 else None
    rates = []
    if len(ab_all) >= 2:
        lb, lc, la = loops
        events = {"truncation": lambda s, _m: s.finish_reason == "length", "loop": lambda s, m: m.get(s.key, False)}
        for name, event in events.items():
            rates.append(RatePairs(
                name, [event(a, lb) for a, _ in ab_all], [event(b, lc) for _, b in ab_all], _clusters([a for a, _ in ab_all]),
                [event(a, lb) for a, _ in aa_all] if len(aa_all) >= 2 else None,
                [event(b, la) for _, b in aa_all] if len(aa_all) >= 2 else None,
                _clusters([a for a, _ in aa_all]) if len(aa_all) >= 2 else None))
        bigrams = _repeated_bigrams(ab_all, aa_all, diversity)
        if bigrams is not None:
            rates.append(bigrams)
    tokens, coverage, cache = None, TokenCoverage(requested=False), None
    if teacher_forcing:
        pair_keys = [a.key for a, _ in ab_all]
        evidence = evidence or token_evidence(base, cand, base_forced_again, pair_keys)
        tokens, coverage = _token_pairs(base, cand, evidence, pair_keys)
        cache = cache_pairs(evidence.cache, base, cand, pair_keys)
    return GateInputs(
        accuracy=tuple(accuracy), lengths=lengths, lengths_floor=floor, tokens=tokens, coverage=coverage,
        rates=tuple(rates), cache=cache,
        base_requests=RequestCounts(sum(1 for k in keys if k in base.samples and not base.samples[k].ok),
                                    sum(1 for k in keys if k in base.samples), _retries(base.samples, keys)),
        cand_requests=RequestCounts(sum(1 for k in keys if k not in cand.samples or not cand.samples[k].ok), len(keys),
                                    _retries(cand.samples, keys)),
    )


def does_not_fit(base: Arm, cand: Arm, aa: Arm | None) -> dict[tuple[str, str], int | None]:
    """Items (suite, id) some arm's server refused as longer than its context, with the limit it
    stated: left out of every arm (the smaller context of the two decides what both are judged on)."""
    out: dict[tuple[str, str], int | None] = {}
    for arm in (base, cand, aa):
        for k, s in (arm.samples.items() if arm is not None else ()):
            if s.does_not_fit:
                limit, before = refused_limit(s.error), out.get((k[0], k[1]))
                out[(k[0], k[1])] = limit if before is None else before if limit is None else min(before, limit)
    return out


def _retries(samples: Mapping[Key, Sample], keys: list[Key]) -> int:
    """Requests sent again after a transient failure, over `keys` (a sample's attempts beyond its first)."""
    return sum(max(0, (samples[k].attempts or 1) - 1) for k in keys if k in samples)


def diversities(base: Arm, cand: Arm, aa: Arm | None) -> Diversity:
    """Each arm's distinct-2 by key (`distinct2`), the outputs the arms share computed once."""
    memo: dict[str, float | None] = {}
    return (distinct2(base.samples, memo), distinct2(cand.samples, memo),
            distinct2(aa.samples, memo) if aa is not None else {})


def _repeated_bigrams(ab: list[tuple[Sample, Sample]], aa: list[tuple[Sample, Sample]],
                      diversity: Diversity) -> RatePairs | None:
    """The `distinct2_loss` guard's inputs: per pair, 1 − distinct-2 of each output (the share of
    its word bigrams that repeat one before), over the pairs where both outputs have two words or
    more; the floor likewise between the baseline and its A/A replicate. None with fewer than 2."""
    db, dc, da = diversity

    def shares(pairs: list[tuple[Sample, Sample]], first: Mapping[Key, float | None],
               second: Mapping[Key, float | None]) -> tuple[list[float], list[float], list[Sample]]:
        kept = [(a, first.get(a.key), second.get(b.key)) for a, b in pairs]
        kept = [(a, x, y) for a, x, y in kept if x is not None and y is not None]
        return [1 - x for _, x, _ in kept], [1 - y for _, _, y in kept], [a for a, _, _ in kept]

    base, cand, units = shares(ab, db, dc)
    if len(units) < 2:
        return None
    fb, fa, funits = shares(aa, db, da)
    floor = len(funits) >= 2
    return RatePairs("repeated_bigrams", base, cand, _clusters(units), fb if floor else None, fa if floor else None,
                     _clusters(funits) if floor else None)


def _unpaired_reason(ref: Forcing, other: Forcing, k: Key) -> str:
    """Why two aligned forced records of `k` gave no compared pair."""
    if not (ref.records[k].aligned and other.records[k].aligned):
        return "tokens differ between the two servers"
    if k not in ref.arrays.index or k not in other.arrays.index:
        return "no token data on disk"
    if not same_windows(ref, other, k):
        return WINDOWS_DIFFER
    return "tokens differ between the two servers"


def _token_pairs(base: Arm, cand: Arm, ev: TokenEvidence, keys: list[Key]) -> tuple[TokenPairs | None, TokenCoverage]:
    """Per-unit KL and top-1 against the A/A floor, and why the pairs left out were left out.

    The floor is the second teacher-forcing pass on the baseline server. When that pass
    reproduced the first bit for bit on at least MIN_REPRODUCED items, the server scores
    deterministically: the floor is 0 on every item (measured on those, implied elsewhere)."""
    reasons: Counter = Counter()
    rows = []
    again = ev.again
    for k in keys:
        fb, fc = base.forced.records.get(k), cand.forced.records.get(k)
        if fb is None or fc is None:
            reasons["not teacher-forced"] += 1
            continue
        ab = ev.ab_means.get(k)
        if ab is None:
            reasons[fb.reason or fc.reason or _unpaired_reason(base.forced, cand.forced, k)] += 1
            continue
        if k in again:
            aa = ev.aa_means.get(k)
            if aa is None:
                reasons[again[k].reason or "A/A pass tokens differ"] += 1
                continue
        elif ev.reproduced:
            aa = (0.0, 1.0)
        else:
            reasons["no A/A teacher-forcing pass"] += 1
            continue
        rows.append((k, ab[0], aa[0], ab[1], aa[1]))
    failed = sum(n for why, n in reasons.items() if str(why).startswith(FAILED))
    coverage = TokenCoverage(True, len(keys), len(rows), reasons, failed)
    if len(rows) < 2:
        return None, coverage
    note = (f"A/A floor: the second pass reproduced the first bit for bit on {len(again)} items, so the floor is 0"
            if ev.reproduced else f"A/A floor measured on {sum(1 for r in rows if r[0] in again)} pairs")
    return TokenPairs(kl_cand=[r[1] for r in rows], kl_floor=[r[2] for r in rows], top1_cand=[r[3] for r in rows],
                      top1_floor=[r[4] for r in rows], clusters=_clusters([base.samples[r[0]] for r in rows]),
                      floor_note=note), coverage


class Built(NamedTuple):
    sections: dict[str, Any]  # per-suite + overall metrics
    inputs: GateInputs  # the gate's inputs over all units
    plots: dict[str, Any]  # the data behind the report's plots
    evidence: TokenEvidence | None  # the teacher-forced comparisons, for the earlier looks to reuse
    examples: list[dict[str, Any]]  # the most divergent pairs


def build(base: Arm, cand: Arm, aa: Arm | None, base_forced_again: Forcing | None, teacher_forcing: bool = True,
          loops: tuple[Mapping[Key, bool], Mapping[Key, bool], Mapping[Key, bool]] | None = None,
          diversity: Diversity | None = None) -> Built:
    """Everything the report says about the pairs, each piece computed once (`Built`)."""
    keys = sorted(base.samples)
    suites = sorted({k[0] for k in keys})
    ab_all, _ = _pairs(base.samples, cand.samples, keys)
    evidence = token_evidence(base, cand, base_forced_again, keys)  # over every key: each look takes its own
    ab_tok, aa_tok = evidence.ab, evidence.aa
    again = base_forced_again if aa_tok is not None else None
    loops = loops or (loop_flags(base.samples), loop_flags(cand.samples), loop_flags(aa.samples) if aa else {})
    div_ab = divergences(ab_all, base.tokens, cand.tokens)
    aa_all, _ = _pairs(base.samples, aa.samples, [k for k in keys if k in aa.samples]) if aa is not None else ([], 0)
    div_aa = divergences(aa_all, base.tokens, aa.tokens) if aa is not None else {}
    diversity = diversity or diversities(base, cand, aa)
    d2_base, d2_cand, d2_aa = diversity
    sections: dict[str, Any] = {}
    for suite in suites + [OVERALL]:
        sk = [k for k in keys if suite == OVERALL or k[0] == suite]
        ab, dropped = _pairs(base.samples, cand.samples, sk)
        aak = [k for k in sk if aa is not None and k in aa.samples]
        aap, _ = _pairs(base.samples, aa.samples, aak) if aa is not None else ([], 0)
        tok_keys = [k for k in sk if k in base.forced.records and k in cand.forced.records]
        aa_keys = [k for k in sk if again is not None and k in base.forced.records and k in again.records]
        sections[suite] = {
            "task": {"ab": task_metrics(ab), "aa": task_metrics(aap) if aap else None},
            "generation": {"ab": generation_metrics(ab, loops[0], loops[1], [div_ab[a.key] for a, _ in ab],
                                                    (d2_base, d2_cand)),
                           "aa": generation_metrics(aap, loops[0], loops[2], [div_aa[a.key] for a, _ in aap],
                                                    (d2_base, d2_aa))
                           if aap else None},
            "teacher": {"ab": token_metrics(ab_tok, tok_keys, len(sk)),
                        "aa": token_metrics(aa_tok, aa_keys, len(sk)) if aa_tok is not None else None},
            "reliability": {
                "base_failed": sum(1 for k in sk if not base.samples[k].ok),
                "cand_failed": sum(1 for k in sk if k not in cand.samples or not cand.samples[k].ok),
                "aa_failed": sum(1 for k in aak if not aa.samples[k].ok) if aa is not None else None,
                "pairs": len(ab), "dropped_pairs": dropped},
        }
    inputs = gate_inputs(base, cand, aa, base_forced_again, keys, teacher_forcing, loops, evidence, diversity)
    evidence = evidence if teacher_forcing else None
    plots = {
        "lengths": {"base": [a.completion_tokens or 0 for a, _ in ab_all],
                    "cand": [b.completion_tokens or 0 for _, b in ab_all],
                    "aa": [b.completion_tokens or 0 for _, b in aa_all] if aa_all else None},
        "first_divergence": {"ab": [div_ab[a.key] for a, _ in ab_all],
                             "aa": [div_aa[a.key] for a, _ in aa_all] if aa_all else None},
        "by_position": {"ab": (sections[OVERALL]["teacher"]["ab"] or {}).get("by_position"),
                        "aa": (sections[OVERALL]["teacher"]["aa"] or {}).get("by_position")},
        "flips": {s: {"right_to_wrong": sections[s]["task"]["ab"]["flips_right_to_wrong"],
                      "wrong_to_right": sections[s]["task"]["ab"]["flips_wrong_to_right"]}
                  for s in suites if sections[s]["task"]["ab"]},
    }
    return Built(sections, inputs, plots, evidence, examples(base.samples, cand.samples, divergences=div_ab))


def common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of two strings: a binary search on slice equality, which runs in
    C (os.path.commonprefix compares character by character in Python)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def examples(base: Mapping[Key, Sample], cand: Mapping[Key, Sample], limit: int = 8,
             divergences: Mapping[Key, int | None] | None = None) -> list[dict[str, Any]]:
    """The most divergent pairs: earliest first divergence first, then biggest length change
    (`divergences`: the pairs' first divergences, where the caller has them)."""
    rows = []
    for k, a in base.items():
        b = cand.get(k)
        if b is None or not (a.ok and b.ok) or a.text == b.text:
            continue
        d = divergences[k] if divergences is not None and k in divergences else divergence(a, b)
        char = common_prefix(a.text or "", b.text or "")
        flip = (a.score or 0) != (b.score or 0)
        rows.append((not flip, d if d is not None else 10**9, -abs((b.completion_tokens or 0) - (a.completion_tokens or 0)),
                     {"suite": k[0], "id": k[1], "repeat": k[2], "first_divergence": d, "divergence_char": char,
                      "base_text": a.text, "cand_text": b.text, "score_base": a.score, "score_cand": b.score}))
    rows.sort(key=lambda r: r[:3])
    return [r[3] for r in rows[:limit]]


def _pct(values: list[float], q: float) -> float | None:
    return _r(float(np.percentile(values, q)), 4) if values else None


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of request intervals: the time an arm had requests in flight (a
    sequential compare's rounds leave gaps between them, which are not the arm's time)."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def speed(samples: Mapping[Key, Sample], concurrency: int,
          server: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Client-side throughput and latency of one arm (TTFT/ITL when streamed), plus what the
    server's own /metrics counted during the run (`server`, from the manifest) when it has any."""
    ok = [s for s in samples.values() if s.ok and s.latency_s and s.started_at]
    if not ok:
        return None
    wall = max(busy_seconds([(s.started_at, s.started_at + s.latency_s) for s in ok]), 1e-9)
    lat = [s.latency_s for s in ok]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    itl = [s.itl_s for s in ok if s.itl_s is not None]
    return {"output_tok_s": _r(sum(s.completion_tokens or 0 for s in ok) / wall, 2), "req_s": _r(len(ok) / wall, 3),
            "latency_p50": _pct(lat, 50), "latency_p95": _pct(lat, 95), "concurrency": concurrency,
            "ttft_p50": _pct(ttft, 50), "ttft_p95": _pct(ttft, 95), "itl_p50": _pct(itl, 50), "itl_p95": _pct(itl, 95),
            "server": dict(server) if server else None, "queued": queueing(server, concurrency)}


QUEUE_MEAN_MIN = 1.0  # requests waiting at the server, on average over the run, that make speed a queue figure


def queueing(server: Mapping[str, Any] | None, concurrency: int) -> str | None:
    """Why this arm's speed figures measure the server's queue rather than its speed, or None: its
    own /metrics say requests waited on average (vLLM num_requests_waiting, SGLang num_queue_reqs,
    llama.cpp requests_deferred, kvqual serve num_queued_reqs) while kvqual kept `concurrency` in
    flight. Without those metrics the queue is not seen (docs/speed.md)."""
    if not server or server.get("waiting_mean") is None:
        return None
    waiting, running = server["waiting_mean"], server.get("running_peak")
    if waiting < QUEUE_MEAN_MIN:
        return None
    ran = f"ran at most {running:g} at once and " if running is not None else ""
    return (f"the server {ran}queued {waiting:.3g} requests on average of the {concurrency} kvqual kept in flight: "
            "latency and tok/s measure the queue")


def throughput_pairs(base: Mapping[Key, Sample], cand: Mapping[Key, Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Per-request output tokens/s, paired by key (requests that produced tokens in both arms)."""
    keys = [k for k in base if k in cand and base[k].ok and cand[k].ok and (base[k].latency_s or 0) > 0
            and (cand[k].latency_s or 0) > 0 and (base[k].completion_tokens or 0) > 0]
    b = np.array([(base[k].completion_tokens or 0) / base[k].latency_s for k in keys])  # type: ignore[operator]
    c = np.array([(cand[k].completion_tokens or 0) / cand[k].latency_s for k in keys])  # type: ignore[operator]
    return b, c


def forcing_from(path: Path, records: Mapping[tuple[str, str, int], Forced]) -> Forcing:
    """A teacher file's records with their per-token data as arrays (an empty pass when the
    records were left out: teacher forcing off or refused)."""
    if not records:
        return Forcing({})
    return Forcing(records, path=path)  # its arrays are read when first used



def forcing_of(path: Path) -> Forcing:
    """A teacher file, read for the judge: records + arrays."""
    return forcing_from(path, load_forced(path, logprobs=False))
