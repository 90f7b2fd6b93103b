"""The teacher-forced comparisons: KL and top-1 agreement of the baseline's completions scored by each
server, against the A/A floor (the baseline scoring them again), and why a pair was left out."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from kvqual.forced import FAILED, Forced
from kvqual.gate import TokenCoverage, TokenPairs, UnusableAnswers
from kvqual.judge import positions as pos
from kvqual.judge import tokens as tk
from kvqual.judge.arms import MIN_REPRODUCED, Arm, Forcing, Key, clusters_of, floor_reproduced, rounded, same_windows, usable
from kvqual.judge.cache import CacheEvidence, cache_evidence
from kvqual.records import unusable_answer


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
        buckets.append({"start": start, "end": end, "n_tokens": n, "mean_kl": rounded(kl[m].mean()) if n else None,
                        "same_top1_rate": rounded(same[m].mean()) if n else None})
    return {"n_items": n_items, "n_tokens": int(kl.size), "misaligned": n_keys - n_items,
            "mean_kl": rounded(kl.mean()), "median_kl": rounded(float(np.median(kl))), "p99_kl": rounded(float(np.quantile(kl, 0.99))),
            "same_top1_rate": rounded(same.mean()), "rms_delta_p": rounded(float(np.sqrt(np.mean(dp**2)))),
            "mean_delta_logprob": rounded(dlp.mean()), "by_position": buckets}



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



def _unpaired_reason(ref: Forcing, other: Forcing, k: Key) -> str:
    """Why two aligned forced records of `k` gave no compared pair."""
    if not (ref.records[k].aligned and other.records[k].aligned):
        return "tokens differ between the two servers"
    if k not in ref.arrays.index or k not in other.arrays.index:
        return "no token data on disk"
    if not same_windows(ref, other, k):
        return WINDOWS_DIFFER
    return "tokens differ between the two servers"



def token_pairs(base: Arm, cand: Arm, ev: TokenEvidence, keys: list[Key],
                rank: Mapping[tuple[str, str], int] | None = None, unusable: Sequence[Key] = (),
                unanswered: int = 0) -> tuple[TokenPairs | None, TokenCoverage, UnusableAnswers | None]:
    """Per-unit KL and top-1 against the A/A floor over `keys` (the pairs both arms answered), why the
    pairs left out were left out, and the units the candidate answered with something that is not data.
    `unanswered`: the pairs not in `keys` because an arm's answer failed after its retries (out of the
    coverage, counted to tell what caused a shortfall).

    The floor is the second teacher-forcing pass on the baseline server. When that pass
    reproduced the first bit for bit on at least MIN_REPRODUCED items, the server scores
    deterministically: the floor is 0 on every item (measured on those, implied elsewhere).
    `unusable`: units whose candidate generation was not data (the judge's `unusable_candidates`);
    a candidate's teacher-forcing answer that was not data counts so too. Both are broken prompts
    (gate/tail.py), judged and so counted as usable, never a teacher-forcing failure.
    `rank`: each item's place in the plan's seeded order, carried with every unit."""
    reasons: Counter = Counter()
    rows = []
    again = ev.again
    bad = list(unusable)
    for k in keys:
        fb, fc = base.forced.records.get(k), cand.forced.records.get(k)
        if fb is None or fc is None:
            reasons["not teacher-forced"] += 1
            continue
        ab = ev.ab_means.get(k)
        if ab is None:
            if fb.reason is None and unusable_answer(fc.reason):
                bad.append(k)
                continue
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
    coverage = TokenCoverage(True, len(keys) + len(unusable), len(rows) + len(bad), reasons, failed, unanswered)
    place = (lambda k: rank.get((k[0], k[1]), len(rank))) if rank is not None else None
    lost = UnusableAnswers(clusters_of([base.samples[k] for k in bad]),
                           [place(k) for k in bad] if place else None) if bad else None
    if len(rows) < 2:
        return None, coverage, lost
    note = (f"A/A floor: the second pass reproduced the first bit for bit on {len(again)} items, so the floor is 0"
            if ev.reproduced else f"A/A floor measured on {sum(1 for r in rows if r[0] in again)} pairs")
    return TokenPairs(kl_cand=[r[1] for r in rows], kl_floor=[r[2] for r in rows], top1_cand=[r[3] for r in rows],
                      top1_floor=[r[4] for r in rows], clusters=clusters_of([base.samples[r[0]] for r in rows]),
                      floor_note=note, rank=[place(r[0]) for r in rows] if place else None), coverage, lost
