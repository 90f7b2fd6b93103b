"""Two saved runs (+ the A/A replicate and teacher-forced files) → metrics and gate inputs.

Pairs are joined by (suite, item id, repeat), never by position, and clustered by item (or
shared context): repeats of an item are one independent unit. A pair where either side
failed is dropped from quality metrics and counted in `dropped_pairs`; failures stay
visible in the reliability section and in the failed-rate criteria.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from kvqual.compare import stats as st
from kvqual.compare import tokens as tk
from kvqual.compare.teacher import Forced
from kvqual.gate import (AccuracyPairs, GateInputs, LengthPairs, RatePairs, RequestCounts, TokenCoverage,
                         TokenPairs)
from kvqual.gate.criteria import CONTEXT_PREFIX
from kvqual.records import Sample

Key = tuple[str, str, int]
OVERALL = "overall"


@dataclass(frozen=True)
class Arm:
    samples: Mapping[Key, Sample]
    forced: Mapping[Key, Forced]  # teacher-forced baseline completions, scored by this arm


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


def _seqs(a: Sample, b: Sample) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Both outputs as token sequences where both came in the same form (both as ids or both as
    strings), else as characters: an id and a string never compare equal."""
    la, lb = a.logprobs, b.logprobs
    if la is not None and lb is not None and (la.token_ids is None) == (lb.token_ids is None):
        return la.tokens, lb.tokens
    return tuple(a.text or ""), tuple(b.text or "")


def _looping(s: Sample, known: Mapping[Key, bool] | None) -> bool:
    if known is not None and s.key in known:
        return known[s.key]
    return tk.text_repetition_loop(s.text or "") is not None


def generation_metrics(pairs: list[tuple[Sample, Sample]], loops_a: Mapping[Key, bool] | None = None,
                       loops_b: Mapping[Key, bool] | None = None) -> dict[str, Any] | None:
    if not pairs:
        return None
    lb = np.array([a.completion_tokens or 0 for a, _ in pairs], dtype=float)
    lc = np.array([b.completion_tokens or 0 for _, b in pairs], dtype=float)
    div = [tk.first_divergence(*_seqs(a, b)) for a, b in pairs]
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


def forced_positions(ref: Forced, other: Forced) -> list[tk.PositionMetrics] | None:
    """Position metrics KL(ref‖other) over the same completion tokens, or None if unusable."""
    if not (ref.aligned and other.aligned and ref.logprobs and other.logprobs):
        return None
    a, b = ref.logprobs, other.logprobs
    if a.tokens != b.tokens:
        return None
    return [tk.position_metrics(ta, tb, la, lb)
            for ta, tb, la, lb in zip(a.top_logprobs, b.top_logprobs, a.token_logprobs, b.token_logprobs)]


def token_metrics(per_item: Mapping[Key, list[tk.PositionMetrics] | None], n_keys: int) -> dict[str, Any] | None:
    usable = {k: v for k, v in per_item.items() if v}
    if not usable:
        return None
    flat = [m for v in usable.values() for m in v]
    positions = [i for v in usable.values() for i in range(len(v))]
    s = tk.summarize_positions(flat)
    buckets = [{"start": b.start, "end": b.end, "n_tokens": b.summary.n_tokens if b.summary else 0,
                "mean_kl": _r(b.summary.mean_kl) if b.summary else None,
                "same_top1_rate": _r(b.summary.same_top1_rate) if b.summary else None}
               for b in tk.bucket_by_position(positions, flat)]
    return {"n_items": len(usable), "n_tokens": s.n_tokens, "misaligned": n_keys - len(usable),
            "mean_kl": _r(s.mean_kl), "median_kl": _r(s.median_kl), "p99_kl": _r(s.p99_kl),
            "same_top1_rate": _r(s.same_top1_rate), "rms_delta_p": _r(s.rms_delta_p),
            "mean_delta_logprob": _r(s.mean_delta_logprob), "by_position": buckets}


def _pairs(a: Mapping[Key, Sample], b: Mapping[Key, Sample], keys: list[Key]) -> tuple[list[tuple[Sample, Sample]], int]:
    good = [(a[k], b[k]) for k in keys if k in a and k in b and a[k].ok and b[k].ok]
    return good, len(keys) - len(good)


def cluster_id(s: Sample) -> str:
    """The independent unit a sample belongs to: its shared context, else its item (repeats of an
    item are one cluster). Prefixes let the gate say "contexts" or "items" (gate/criteria.py)."""
    return f"{CONTEXT_PREFIX}{s.context_id}" if s.context_id else f"item:{s.suite}\x00{s.id}"


def _clusters(samples: list[Sample]) -> np.ndarray:
    return np.array([cluster_id(s) for s in samples], dtype=object)


def _same_tokens(a: Forced, b: Forced) -> bool:
    """Two teacher-forced passes gave bit-identical logprobs (tokens, scored logprobs and top-k)."""
    return bool(a.aligned and b.aligned and a.logprobs is not None and b.logprobs is not None
                and a.logprobs.tokens == b.logprobs.tokens
                and a.logprobs.token_logprobs == b.logprobs.token_logprobs
                and a.logprobs.top_logprobs == b.logprobs.top_logprobs)


def floor_reproduced(base_forced: Mapping[Key, Forced], again: Mapping[Key, Forced]) -> bool:
    """The second teacher-forcing pass reproduced the first bit for bit on every item it covered."""
    both = [k for k in again if k in base_forced]
    return bool(both) and all(_same_tokens(base_forced[k], again[k]) for k in both)


MIN_REPRODUCED = 8  # items a bit-identical second pass must cover before its floor (0) is extended to all


def loop_flags(samples: Mapping[Key, Sample]) -> dict[Key, bool]:
    """Whether each answered sample ends in a repetition loop (computed once per sample)."""
    return {k: tk.text_repetition_loop(s.text or "") is not None for k, s in samples.items() if s.ok}


def gate_inputs(base: Arm, cand: Arm, aa: Arm | None, base_forced_again: Mapping[Key, Forced] | None,
                keys: list[Key], teacher_forcing: bool = True,
                loops: tuple[Mapping[Key, bool], Mapping[Key, bool], Mapping[Key, bool]] | None = None) -> GateInputs:
    """The gate's inputs over `keys` (every unit judged at one look): paired by key, clustered by item."""
    loops = loops or (loop_flags(base.samples), loop_flags(cand.samples), loop_flags(aa.samples) if aa else {})
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
    tokens, coverage = None, TokenCoverage(requested=False)
    if teacher_forcing:
        tokens, coverage = _token_pairs(base, cand, base_forced_again or {}, [a.key for a, _ in ab_all])
    return GateInputs(
        accuracy=tuple(accuracy), lengths=lengths, lengths_floor=floor, tokens=tokens, coverage=coverage,
        rates=tuple(rates),
        base_requests=RequestCounts(sum(1 for k in keys if k in base.samples and not base.samples[k].ok),
                                    sum(1 for k in keys if k in base.samples)),
        cand_requests=RequestCounts(sum(1 for k in keys if k not in cand.samples or not cand.samples[k].ok), len(keys)),
    )


def _token_pairs(base: Arm, cand: Arm, again: Mapping[Key, Forced], keys: list[Key]) -> tuple[TokenPairs | None, TokenCoverage]:
    """Per-unit KL and top-1 against the A/A floor, and why the pairs left out were left out.

    The floor is the second teacher-forcing pass on the baseline server. When that pass
    reproduced the first bit for bit on at least MIN_REPRODUCED items, the server scores
    deterministically: the floor is 0 on every item (measured on those, implied elsewhere)."""
    reproduced = floor_reproduced(base.forced, again) and len(again) >= MIN_REPRODUCED
    reasons: Counter = Counter()
    rows = []
    for k in keys:
        fb, fc = base.forced.get(k), cand.forced.get(k)
        if fb is None or fc is None:
            reasons["not teacher-forced"] += 1
            continue
        ab = forced_positions(fb, fc)
        if ab is None:
            reasons[fb.reason or fc.reason or "tokens differ between the two servers"] += 1
            continue
        if k in again:
            aa = forced_positions(fb, again[k])
            if aa is None:
                reasons[again[k].reason or "A/A pass tokens differ"] += 1
                continue
            kl_f, top_f = float(np.mean([m.kl for m in aa])), float(np.mean([m.same_top1 for m in aa]))
        elif reproduced:
            kl_f, top_f = 0.0, 1.0
        else:
            reasons["no A/A teacher-forcing pass"] += 1
            continue
        rows.append((k, float(np.mean([m.kl for m in ab])), kl_f, float(np.mean([m.same_top1 for m in ab])), top_f))
    coverage = TokenCoverage(True, len(keys), len(rows), reasons)
    if len(rows) < 2:
        return None, coverage
    note = (f"A/A floor: the second pass reproduced the first bit for bit on {len(again)} items, so the floor is 0"
            if reproduced else f"A/A floor measured on {sum(1 for r in rows if r[0] in again)} pairs")
    return TokenPairs(kl_cand=[r[1] for r in rows], kl_floor=[r[2] for r in rows], top1_cand=[r[3] for r in rows],
                      top1_floor=[r[4] for r in rows], clusters=_clusters([base.samples[r[0]] for r in rows]),
                      floor_note=note), coverage


def build(base: Arm, cand: Arm, aa: Arm | None, base_forced_again: Mapping[Key, Forced] | None,
          teacher_forcing: bool = True) -> tuple[dict[str, Any], GateInputs, dict[str, Any]]:
    """Per-suite + overall metrics, the gate's inputs (all units), and the data behind the report's plots."""
    keys = sorted(base.samples)
    suites = sorted({k[0] for k in keys})
    ab_tok = {k: forced_positions(base.forced[k], cand.forced[k]) for k in keys
              if k in base.forced and k in cand.forced}
    aa_tok = ({k: forced_positions(base.forced[k], base_forced_again[k]) for k in keys
               if k in base.forced and k in base_forced_again} if base_forced_again else {})
    loops = (loop_flags(base.samples), loop_flags(cand.samples), loop_flags(aa.samples) if aa else {})
    sections: dict[str, Any] = {}
    for suite in suites + [OVERALL]:
        sk = [k for k in keys if suite == OVERALL or k[0] == suite]
        ab, dropped = _pairs(base.samples, cand.samples, sk)
        aak = [k for k in sk if aa is not None and k in aa.samples]
        aap, _ = _pairs(base.samples, aa.samples, aak) if aa is not None else ([], 0)
        sections[suite] = {
            "task": {"ab": task_metrics(ab), "aa": task_metrics(aap) if aap else None},
            "generation": {"ab": generation_metrics(ab, loops[0], loops[1]),
                           "aa": generation_metrics(aap, loops[0], loops[2]) if aap else None},
            "teacher": {"ab": token_metrics({k: ab_tok.get(k) for k in sk if k in ab_tok}, len(sk)),
                        "aa": token_metrics({k: aa_tok.get(k) for k in sk if k in aa_tok}, len(sk)) if aa_tok else None},
            "reliability": {
                "base_failed": sum(1 for k in sk if not base.samples[k].ok),
                "cand_failed": sum(1 for k in sk if k not in cand.samples or not cand.samples[k].ok),
                "aa_failed": sum(1 for k in aak if not aa.samples[k].ok) if aa is not None else None,
                "pairs": len(ab), "dropped_pairs": dropped},
        }
    inputs = gate_inputs(base, cand, aa, base_forced_again, keys, teacher_forcing, loops)
    ab_all, _ = _pairs(base.samples, cand.samples, keys)
    aa_all, _ = _pairs(base.samples, aa.samples, [k for k in keys if k in aa.samples]) if aa is not None else ([], 0)
    plots = {
        "lengths": {"base": [a.completion_tokens or 0 for a, _ in ab_all],
                    "cand": [b.completion_tokens or 0 for _, b in ab_all],
                    "aa": [b.completion_tokens or 0 for _, b in aa_all] if aa_all else None},
        "first_divergence": {"ab": [tk.first_divergence(*_seqs(a, b)) for a, b in ab_all],
                             "aa": [tk.first_divergence(*_seqs(a, b)) for a, b in aa_all] if aa_all else None},
        "by_position": {"ab": (sections[OVERALL]["teacher"]["ab"] or {}).get("by_position"),
                        "aa": (sections[OVERALL]["teacher"]["aa"] or {}).get("by_position")},
        "flips": {s: {"right_to_wrong": sections[s]["task"]["ab"]["flips_right_to_wrong"],
                      "wrong_to_right": sections[s]["task"]["ab"]["flips_wrong_to_right"]}
                  for s in suites if sections[s]["task"]["ab"]},
    }
    return sections, inputs, plots


def examples(base: Mapping[Key, Sample], cand: Mapping[Key, Sample], limit: int = 8) -> list[dict[str, Any]]:
    """The most divergent pairs: earliest first divergence first, then biggest length change."""
    rows = []
    for k, a in base.items():
        b = cand.get(k)
        if b is None or not (a.ok and b.ok) or a.text == b.text:
            continue
        d = tk.first_divergence(*_seqs(a, b))
        char = next((i for i, (x, y) in enumerate(zip(a.text or "", b.text or "")) if x != y),
                    min(len(a.text or ""), len(b.text or "")))
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
