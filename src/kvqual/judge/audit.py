"""`kvqual audit`'s judge, pure over what the audit saved: existing outputs scored by the reference (and
the candidate), against a floor measured the same way on the reference's own outputs (docs/audit.md).

Per audited unit (one sampled output):
- without a candidate server: the share of its tokens that are the reference's top-1 at that position
  (teacher-forced on the reference), against the same share of the reference's own greedy output for the
  same prompt, forced on the reference (the floor) — the gate's `top1_loss`; KL cannot be measured with
  one server's distributions and is reported as not evaluated;
- with a candidate: KL(reference‖candidate) and same-top-1 over the audited tokens scored by both servers,
  against the reference scoring them twice (the A/A floor) — the gate's `kl_excess` and `top1_loss`, as
  in `kvqual compare`, on the audited tokens instead of the baseline's;
- length, truncation, loop and repeated-bigram rates of the audited outputs against the reference's own
  outputs for the same prompts (`judge.metrics.gate_inputs`).
Figures beside the verdict: mean log-probability per token under the reference (audited vs its own), by
position bucket, and the audited outputs the reference found least likely, for a person to read.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np

from kvqual import stats as st
from kvqual.forced import FAILED
from kvqual.gate import GatePolicy, TokenCoverage, TokenPairs, Verdict, decide_sequence
from kvqual.judge import positions as pos
from kvqual.judge import tokens as tk
from kvqual.judge.arms import MIN_REPRODUCED, Arm, Forcing, Key, clusters_of, floor_reproduced, rounded, usable
from kvqual.judge.metrics import gate_inputs
from kvqual.records import Item, Sample

NO_KL = ("no candidate server: KL needs the candidate's distribution over the same tokens "
         "(kvqual audit --candidate); top-1 agreement with the audited tokens is judged instead")
DRIFTED = 10  # outputs listed for a person to read


@dataclass(frozen=True)
class OwnScores:
    """Each unit's tokens scored by one server: per position, whether the token was its top-1, the
    token's log-probability and its index in the completion; `starts` delimits the units."""

    keys: list[Key]
    starts: np.ndarray
    same_top1: np.ndarray
    logprob: np.ndarray
    position: np.ndarray

    def mean(self, values: np.ndarray) -> dict[Key, float]:
        lengths = np.diff(self.starts)
        if not lengths.size:
            return {}
        sums = np.add.reduceat(values.astype(np.float64), self.starts[:-1])
        return dict(zip(self.keys, (sums / lengths).tolist()))

    def lowest(self) -> dict[Key, tuple[int, float]]:
        """Each unit's least likely token: its position and log-probability."""
        out = {}
        for i, k in enumerate(self.keys):
            lp = self.logprob[self.starts[i]:self.starts[i + 1]]
            at = int(np.argmin(lp))
            out[k] = (at, float(lp[at]))
        return out


def own_scores(forcing: Forcing, keys: Sequence[Key]) -> OwnScores:
    """Top-1 agreement and log-probability of each unit's own tokens as `forcing`'s server scored them."""
    keys = [k for k in keys if usable(forcing, k)]
    a = forcing.arrays
    rows = a.rows(keys)
    lengths = a.lengths(rows)
    keep = lengths > 0
    keys, rows, lengths = [k for k, ok in zip(keys, keep) if ok], rows[keep], lengths[keep]
    starts = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    total = int(starts[-1])
    if not total:
        z = np.zeros(0)
        return OwnScores([], starts, z.astype(bool), z, z.astype(np.int32))
    seg = np.repeat(np.arange(rows.size), lengths)
    within = np.arange(total) - np.repeat(starts[:-1], lengths)
    x = a.starts[rows][seg] + within
    same = a.is_top1(x)  # ties count: the same answer whatever top-k the passes asked
    return OwnScores(keys, starts, same, a.logprob[x].astype(np.float64), within.astype(np.int32))


def _buckets(scores: OwnScores, floor: OwnScores, kl: pos.PairPositions | None) -> list[dict[str, Any]]:
    rows = []
    for i, start in enumerate(tk.DEFAULT_BUCKETS):
        end = tk.DEFAULT_BUCKETS[i + 1] if i + 1 < len(tk.DEFAULT_BUCKETS) else None

        def pick(where: np.ndarray) -> np.ndarray:
            return (where >= start) & (where < end if end is not None else True)

        m, f = pick(scores.position), pick(floor.position)
        row: dict[str, Any] = {"start": start, "end": end, "n_tokens": int(m.sum()), "floor_tokens": int(f.sum()),
                               "same_top1": rounded(scores.same_top1[m].mean()) if m.any() else None,
                               "floor_same_top1": rounded(floor.same_top1[f].mean()) if f.any() else None,
                               "mean_logprob": rounded(scores.logprob[m].mean()) if m.any() else None,
                               "floor_mean_logprob": rounded(floor.logprob[f].mean()) if f.any() else None}
        if kl is not None:
            k = pick(kl.position)
            row["mean_kl"] = rounded(kl.kl[k].mean()) if k.any() else None
            row["same_top1_candidate"] = rounded(kl.same_top1[k].mean()) if k.any() else None
        rows.append(row)
    return rows


def _interval(diffs: list[float], clusters: np.ndarray, level: float = 0.95) -> dict[str, Any] | None:
    if len(diffs) < 2 or len(set(clusters.tolist())) < 2:
        return None
    m = st.mean_ci(diffs, clusters, level)
    return {"estimate": rounded(m.estimate), "low": rounded(m.low), "high": rounded(m.high), "level": level,
            "n": m.n, "clusters": m.n_clusters}


def _paired(audited: Mapping[Key, float], floor: Mapping[Key, float], paired: list[Key],
            clusters: np.ndarray) -> dict[str, Any]:
    """A per-unit figure's mean on the audited outputs and on the floor, and their paired difference."""
    return {"audited": rounded(np.mean([audited[k] for k in paired])) if paired else None,
            "floor": rounded(np.mean([floor[k] for k in paired])) if paired else None,
            "difference": _interval([audited[k] - floor[k] for k in paired], clusters)}


@dataclass(frozen=True)
class AuditEvidence:
    """The teacher-forced figures of an audit, computed once for every look."""

    audited: OwnScores  # the audited tokens scored by the reference
    floor: OwnScores  # the reference's own outputs scored by the reference
    ab: pos.PairPositions | None  # with a candidate: the audited tokens, reference vs candidate
    aa: pos.PairPositions | None  # reference vs reference again (None: reproduced bit for bit, or no candidate)
    reproduced: bool


def evidence(on_ref: Forcing, floor_on_ref: Forcing, on_cand: Forcing | None, again: Forcing | None,
             keys: Sequence[Key]) -> AuditEvidence:
    ab = aa = None
    reproduced = False
    if on_cand is not None:
        both = [k for k in keys if usable(on_ref, k) and usable(on_cand, k)]
        ab = pos.compare_forced(on_ref.arrays, on_cand.arrays, both)
        if again is not None and again.records:
            reproduced = floor_reproduced(on_ref, again) and len(again.records) >= MIN_REPRODUCED
            if not reproduced:
                aa = pos.compare_forced(on_ref.arrays, again.arrays,
                                        [k for k in keys if usable(on_ref, k) and usable(again, k)])
    return AuditEvidence(own_scores(on_ref, keys), own_scores(floor_on_ref, keys), ab, aa, reproduced)


def _coverage(records: Mapping[Key, Any], keys: Sequence[Key], usable_keys: set[Key],
              floor: Mapping[Key, Any] | None = None) -> TokenCoverage:
    """How many of `keys` gave token metrics, and why the others did not: their own scoring's reason, or
    (scored, but no floor to set them against) the floor's."""
    reasons: Counter = Counter()
    failed = 0
    for k in keys:
        if k in usable_keys:
            continue
        f = records.get(k)
        why = "not teacher-forced" if f is None else (f.reason or "")
        if not why and floor is not None:
            g = floor.get(k)
            why = ("the reference's own output for this prompt: " + ("not teacher-forced" if g is None else
                   g.reason or "no token data"))
        why = why or "no token data"
        failed += why.startswith(FAILED)
        reasons[why.split(":", 1)[0] if why.startswith(FAILED) else why] += 1
    return TokenCoverage(True, len(keys), len(usable_keys & set(keys)), reasons, failed)


def token_pairs(ev: AuditEvidence, audited: Mapping[Key, Sample], keys: Sequence[Key], on_ref: Forcing,
                floor_records: Mapping[Key, Any]) -> tuple[TokenPairs | None, TokenCoverage]:
    """The gate's token inputs over `keys` (one look's units) and how many were usable."""
    a_top1, f_top1 = ev.audited.mean(ev.audited.same_top1), ev.floor.mean(ev.floor.same_top1)
    if ev.ab is None:  # one server: KL is never measured, whatever else is missing
        units = [k for k in keys if k in a_top1 and k in f_top1]
        cov = _coverage(on_ref.records, keys, set(units), floor_records)
        return TokenPairs(None, None, [a_top1[k] for k in units], [f_top1[k] for k in units],
                          clusters_of([audited[k] for k in units]),
                          "floor: the reference's own outputs for the same prompts, scored by it", NO_KL), cov
    kl_ab, top_ab = ev.ab.mean(ev.ab.kl), ev.ab.mean(ev.ab.same_top1)
    cand = dict(zip(ev.ab.keys, zip(kl_ab.tolist(), top_ab.tolist())))
    if ev.aa is not None:
        floor = dict(zip(ev.aa.keys, zip(ev.aa.mean(ev.aa.kl).tolist(), ev.aa.mean(ev.aa.same_top1).tolist())))
        note = "floor: the reference scoring the audited tokens a second time"
    elif ev.reproduced:
        floor = {k: (0.0, 1.0) for k in cand}
        note = "floor 0: the reference's second scoring reproduced its first bit for bit"
    else:
        floor = {}
        note = ""
    units = [k for k in keys if k in cand and k in floor]
    cov = _coverage(on_ref.records, keys, set(units))
    if len(units) < 2:
        return None, cov
    return TokenPairs([cand[k][0] for k in units], [floor[k][0] for k in units], [cand[k][1] for k in units],
                      [floor[k][1] for k in units], clusters_of([audited[k] for k in units]), note), cov


def _drifted(ev: AuditEvidence, items: Mapping[tuple[str, str], Item], audited: Mapping[Key, Sample],
             keys: set[Key], lines: Mapping[str, int]) -> list[dict[str, Any]]:
    """The audited outputs the reference found least likely (lowest mean log-probability a token)."""
    means, floor, lowest = ev.audited.mean(ev.audited.logprob), ev.floor.mean(ev.floor.logprob), ev.audited.lowest()
    ranked = sorted((k for k in means if k in keys), key=lambda k: (means[k], k))[:DRIFTED]
    out = []
    for k in ranked:
        item, s = items[(k[0], k[1])], audited[k]
        prompt = item.prompt if isinstance(item.prompt, str) else (
            item.messages[-1].get("content") if item.messages else f"{len(item.prompt or ())} token ids")
        at, lp = lowest[k]
        out.append({"id": k[1], "line": lines.get(k[1]), "mean_logprob": rounded(means[k], 4),
                    "floor_mean_logprob": rounded(floor.get(k), 4), "lowest_position": at,
                    "lowest_logprob": rounded(lp, 4),
                    "prompt": str(prompt)[:200], "completion": (s.text or "")[:400]})
    return out


def judge_audit(items: Mapping[tuple[str, str], Item], audited: Mapping[Key, Sample], floor: Mapping[Key, Sample],
                on_ref: Forcing, floor_on_ref: Forcing, on_cand: Forcing | None, again: Forcing | None,
                order: Sequence[Key], sizes: Sequence[int], planned: Sequence[int], policy: GatePolicy,
                seed: int, lines: Mapping[str, int] = {}) -> tuple[Verdict, dict[str, Any]]:
    """The verdict over the looks taken (`sizes[k]` units of `order` at look k, of the `planned`
    schedule) and the audit's figures over every unit judged; `lines`: each output's line in its file."""
    keys_all = list(order[:sizes[-1]])
    ev = evidence(on_ref, floor_on_ref, on_cand, again, keys_all)
    base, cand = Arm(floor), Arm(audited)
    looks = []
    for n in sizes:
        keys = list(order[:n])
        inputs = gate_inputs(base, cand, None, None, keys, teacher_forcing=False)
        tokens, cov = token_pairs(ev, audited, keys, on_ref, floor_on_ref.records)
        looks.append((n, replace(inputs, tokens=tokens, coverage=cov)))
    verdict = decide_sequence(policy, looks, seed, planned)
    a_lp, f_lp = ev.audited.mean(ev.audited.logprob), ev.floor.mean(ev.floor.logprob)
    a_top, f_top = ev.audited.mean(ev.audited.same_top1), ev.floor.mean(ev.floor.same_top1)
    paired = [k for k in keys_all if k in a_lp and k in f_lp]
    clusters = clusters_of([audited[k] for k in paired])
    figures: dict[str, Any] = {
        "units": len(keys_all), "scored": len(a_lp), "floor_scored": len(f_lp),
        "tokens_scored": int(ev.audited.logprob.size), "floor_tokens_scored": int(ev.floor.logprob.size),
        "mean_logprob": _paired(a_lp, f_lp, paired, clusters),
        "same_top1_with_reference": _paired(a_top, f_top, paired, clusters),
        "by_position": _buckets(ev.audited, ev.floor, ev.ab),
        "most_drifted": _drifted(ev, items, audited, set(keys_all), lines),
    }
    if ev.ab is not None:
        figures["candidate"] = {"pairs": len(ev.ab.keys), "tokens": int(ev.ab.kl.size),
                                "mean_kl": rounded(ev.ab.kl.mean()) if ev.ab.kl.size else None,
                                "same_top1": rounded(ev.ab.same_top1.mean()) if ev.ab.kl.size else None,
                                "floor": "reproduced bit for bit" if ev.reproduced else
                                         ("measured" if ev.aa is not None else "none")}
    return verdict, figures
