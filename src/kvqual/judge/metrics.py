"""Two saved runs (+ the A/A replicate and teacher-forced files) → metrics and gate inputs.

Pairs are joined by (suite, item id, repeat), never by position, and clustered by item (or
shared context): repeats of an item are one independent unit. A pair where either side
failed is dropped from quality metrics and counted in `dropped_pairs`; failures stay
visible in the reliability section and in the failed-rate criteria.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np

from kvqual import stats as st
from kvqual.gate import AccuracyPairs, GateInputs, LengthPairs, RatePairs, RequestCounts, TokenCoverage
from kvqual.judge import positions as pos
from kvqual.judge import tokens as tk
from kvqual.judge.arms import Arm, Forcing, Key, clusters_of, rounded
from kvqual.judge.cache import cache_pairs
from kvqual.judge.teacher import TokenEvidence, token_evidence, token_metrics, token_pairs
from kvqual.records import Sample, refused_limit, unusable_answer

Diversity = tuple[Mapping[Key, float | None], Mapping[Key, float | None], Mapping[Key, float | None]]  # distinct-2 by arm
OVERALL = "overall"


def _ci(interval: Any) -> list[float | None]:
    return [rounded(interval.low), rounded(interval.high)]


def task_metrics(pairs: list[tuple[Sample, Sample]]) -> dict[str, Any] | None:
    scored = [(a, b) for a, b in pairs if a.score is not None and b.score is not None]
    if not scored:
        return None
    base = np.array([a.score >= 0.5 for a, _ in scored])
    cand = np.array([b.score >= 0.5 for _, b in scored])
    counts = st.paired_counts(base, cand)
    return {
        "n": counts.n,
        "acc_base": rounded(base.mean()), "acc_base_ci": _ci(st.wilson_ci(int(base.sum()), base.size)),
        "acc_cand": rounded(cand.mean()), "acc_cand_ci": _ci(st.wilson_ci(int(cand.sum()), cand.size)),
        "diff": rounded(counts.difference), "diff_ci": _ci(st.newcombe_ci(counts)),
        "flips_right_to_wrong": counts.b, "flips_wrong_to_right": counts.c,
        "mcnemar_p": rounded(st.mcnemar_exact_p(counts.b, counts.c)),
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
        out.update(distinct2_base=rounded(float(x.mean())), distinct2_cand=rounded(float(y.mean())),
                   distinct2_diff=rounded(d.estimate), distinct2_diff_ci=[rounded(d.low), rounded(d.high)])
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
        "exact_rate": rounded(np.mean([a.text == b.text for a, b in pairs])),
        "first_div_median": rounded(float(np.median(diverged))) if diverged else None,
        "diverge_within_16": rounded(np.mean([d is not None and d < 16 for d in div])),
        "len_base_mean": rounded(lb.mean()), "len_cand_mean": rounded(lc.mean()),
        "len_ratio": None, "len_ratio_ci": [None, None], "wilcoxon_p": None, "hl_shift": None,
        "hl_ci": [None, None], "ks_stat": None, "ks_p": None,
        "trunc_base": rounded(np.mean([a.finish_reason == "length" for a, _ in pairs])),
        "trunc_cand": rounded(np.mean([b.finish_reason == "length" for _, b in pairs])),
        "loops_base": rounded(np.mean([_looping(a, loops_a) for a, _ in pairs])),
        "loops_cand": rounded(np.mean([_looping(b, loops_b) for _, b in pairs])),
        # the length distribution's upper part (where runaway outputs show), and diversity
        **{f"len_{arm}_p{q}": rounded(float(np.percentile(v, q))) for q in LENGTH_QUANTILES for arm, v in
           (("base", lb), ("cand", lc))},
        **_diversity(pairs, diversity),
    }
    if lb.sum() > 0 and len(pairs) >= 2:
        ratio, _ = st.ratio_of_means_ci(lb, lc)
        out.update(len_ratio=rounded(ratio.estimate), len_ratio_ci=_ci(ratio))
        hl = st.hodges_lehmann(lc - lb)
        out.update(hl_shift=rounded(hl.estimate), hl_ci=_ci(hl))
        ks = st.ks_two_sample(lb, lc)
        out.update(ks_stat=rounded(ks.statistic), ks_p=rounded(ks.pvalue))
        if np.any(lc != lb):
            out["wilcoxon_p"] = rounded(st.wilcoxon_signed_rank(lb, lc).pvalue)
    return out


def _pairs(a: Mapping[Key, Sample], b: Mapping[Key, Sample], keys: list[Key]) -> tuple[list[tuple[Sample, Sample]], int]:
    good = [(a[k], b[k]) for k in keys if k in a and k in b and a[k].ok and b[k].ok]
    return good, len(keys) - len(good)


def loop_flags(samples: Mapping[Key, Sample]) -> dict[Key, bool]:
    """Whether each answered sample ends in a repetition loop (computed once per sample)."""
    return {k: tk.text_repetition_loop(s.text or "") is not None for k, s in samples.items() if s.ok}


def unusable_candidates(base: Arm, cand: Arm, keys: list[Key]) -> list[Key]:
    """Units the baseline answered and the candidate answered with something that is not data (NaN
    logprobs, a body that is not JSON): the candidate's own outcome, a broken prompt and a wrong
    answer, never a failed request (gate/tail.py)."""
    return [k for k in keys if k in base.samples and base.samples[k].ok and k in cand.samples
            and unusable_answer(cand.samples[k].error)]


def gate_inputs(base: Arm, cand: Arm, aa: Arm | None, base_forced_again: Forcing | None,
                keys: list[Key], teacher_forcing: bool = True,
                loops: tuple[Mapping[Key, bool], Mapping[Key, bool], Mapping[Key, bool]] | None = None,
                evidence: TokenEvidence | None = None, diversity: Diversity | None = None,
                rank: Mapping[tuple[str, str], int] | None = None) -> GateInputs:
    """The gate's inputs over `keys` (every unit judged at one look): paired by key, clustered by
    item. `evidence`: the teacher-forced comparisons over all keys, `loops` and `diversity` each
    arm's loop flags and distinct-2 by key, where the caller has them; `rank` each item's place in
    the plan's seeded order (the token criteria bet on the units in that order)."""
    loops = loops or (loop_flags(base.samples), loop_flags(cand.samples), loop_flags(aa.samples) if aa else {})
    diversity = diversity or diversities(base, cand, aa)
    unfit = does_not_fit(base, cand, aa)
    keys = [k for k in keys if (k[0], k[1]) not in unfit]  # left out of every arm, neither answer nor failure
    suites = sorted({k[0] for k in keys})
    ab_all, unanswered = _pairs(base.samples, cand.samples, keys)
    aa_keys = [k for k in keys if aa is not None and k in aa.samples]
    aa_all, _ = _pairs(base.samples, aa.samples, aa_keys) if aa is not None else ([], 0)
    unusable = unusable_candidates(base, cand, keys)
    accuracy = []
    for suite in suites:
        scored = [(a, b) for a, b in ab_all if a.suite == suite and a.score is not None and b.score is not None]
        # a scored item the candidate answered with no data: a wrong answer of the candidate's
        lost = [base.samples[k] for k in unusable if k[0] == suite and base.samples[k].score is not None]
        if scored or lost:
            accuracy.append(AccuracyPairs(suite, [a.score >= 0.5 for a, _ in scored] + [a.score >= 0.5 for a in lost],
                                          [b.score >= 0.5 for _, b in scored] + [False] * len(lost),
                                          clusters_of([a for a, _ in scored] + lost)))
    lengths = LengthPairs([a.completion_tokens or 0 for a, _ in ab_all], [b.completion_tokens or 0 for _, b in ab_all],
                          clusters_of([a for a, _ in ab_all])) if len(ab_all) >= 2 else None
    floor = LengthPairs([a.completion_tokens or 0 for a, _ in aa_all], [b.completion_tokens or 0 for _, b in aa_all],
                        clusters_of([a for a, _ in aa_all])) if len(aa_all) >= 2 else None
    rates = []
    if len(ab_all) >= 2:
        lb, lc, la = loops
        events = {"truncation": lambda s, _m: s.finish_reason == "length", "loop": lambda s, m: m.get(s.key, False)}
        for name, event in events.items():
            rates.append(RatePairs(
                name, [event(a, lb) for a, _ in ab_all], [event(b, lc) for _, b in ab_all], clusters_of([a for a, _ in ab_all]),
                [event(a, lb) for a, _ in aa_all] if len(aa_all) >= 2 else None,
                [event(b, la) for _, b in aa_all] if len(aa_all) >= 2 else None,
                clusters_of([a for a, _ in aa_all]) if len(aa_all) >= 2 else None))
        bigrams = _repeated_bigrams(ab_all, aa_all, diversity)
        if bigrams is not None:
            rates.append(bigrams)
    tokens, coverage, cache, lost_answers = None, TokenCoverage(requested=False), None, None
    if teacher_forcing:
        pair_keys = [a.key for a, _ in ab_all]
        evidence = evidence or token_evidence(base, cand, base_forced_again, pair_keys)
        # the candidate's answers that were not data are judged (broken prompts), not unanswered
        tokens, coverage, lost_answers = token_pairs(base, cand, evidence, pair_keys, rank, unusable,
                                                     unanswered - len(unusable))
        cache = cache_pairs(evidence.cache, base, cand, pair_keys)
    lost = set(unusable)
    return GateInputs(
        accuracy=tuple(accuracy), lengths=lengths, lengths_floor=floor, tokens=tokens, coverage=coverage,
        rates=tuple(rates), cache=cache, unusable=lost_answers,
        base_requests=RequestCounts(sum(1 for k in keys if k in base.samples and not base.samples[k].ok),
                                    sum(1 for k in keys if k in base.samples), _retries(base.samples, keys)),
        cand_requests=RequestCounts(sum(1 for k in keys if (k not in cand.samples or not cand.samples[k].ok)
                                        and k not in lost), len(keys), _retries(cand.samples, keys)),
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
    return RatePairs("repeated_bigrams", base, cand, clusters_of(units), fb if floor else None, fa if floor else None,
                     clusters_of(funits) if floor else None)


class Built(NamedTuple):
    sections: dict[str, Any]  # per-suite + overall metrics
    inputs: GateInputs  # the gate's inputs over all units
    plots: dict[str, Any]  # the data behind the report's plots
    evidence: TokenEvidence | None  # the teacher-forced comparisons, for the earlier looks to reuse
    examples: list[dict[str, Any]]  # the most divergent pairs


def build(base: Arm, cand: Arm, aa: Arm | None, base_forced_again: Forcing | None, teacher_forcing: bool = True,
          loops: tuple[Mapping[Key, bool], Mapping[Key, bool], Mapping[Key, bool]] | None = None,
          diversity: Diversity | None = None, rank: Mapping[tuple[str, str], int] | None = None) -> Built:
    """Everything the report says about the pairs, each piece computed once (`Built`); `rank` as
    `gate_inputs` takes it."""
    keys = sorted(base.samples)
    suites = sorted({k[0] for k in keys})
    ab_all, unanswered = _pairs(base.samples, cand.samples, keys)
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
    inputs = gate_inputs(base, cand, aa, base_forced_again, keys, teacher_forcing, loops, evidence, diversity,
                         rank)
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
    # ties broken by the key: samples.jsonl holds answers in the order they finished, which concurrency varies
    rows.sort(key=lambda r: (*r[:3], r[3]["suite"], r[3]["id"], r[3]["repeat"]))
    return [r[3] for r in rows[:limit]]


