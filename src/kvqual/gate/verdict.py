"""Criteria → PASS / FAIL / INCONCLUSIVE, at one look or replayed over a sequential compare's looks.

Rules (docs/statistics.md, "The gate"):
* FAIL when some criterion — primary or guard — is shown outside its bound after Holm over
  every criterion with a fail test. At a sequential look Holm's step j tests at the nominal
  level α′(α/j) (gate/sequential.py), so the false-FAIL rate stays ≤ α over all looks.
* PASS when every *primary* criterion is shown inside its bound (an intersection–union test:
  each at α′(α), no adjustment) and no guard failed. A guard left undecided (a 20-item
  suite cannot show ±5 points) does not block PASS.
* INCONCLUSIVE otherwise, with the clusters each open primary criterion would need.
A sequential compare stops at the first look whose verdict is PASS or FAIL; a primary
criterion shown inside at an earlier look stays shown (its own sequential test stopped there).
It also stops, INCONCLUSIVE, when the candidate is *on its margin*: an open criterion's interval
holds its bound and the plan's last look would decide with less than FUTILITY_POWER at the current
estimate (gate/futility.py, a non-binding futility stop); the verdict then carries `on_margin`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from kvqual import stats as st
from kvqual.gate import criteria as cr
from kvqual.gate import futility as fu
from kvqual.gate.criteria import Criterion, Status
from kvqual.gate.inputs import GateInputs
from kvqual.gate.policy import GatePolicy
from kvqual.gate.sequential import nominal_alpha

EXIT_CODES: Mapping[str, int] = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3}


@dataclass(frozen=True)
class Verdict:
    """The gate's answer, with every criterion behind it (and, when sequential, the looks)."""

    verdict: str
    criteria: tuple[Criterion, ...]
    reason: str
    policy: GatePolicy = field(default_factory=GatePolicy)
    looks: tuple[dict[str, Any], ...] = ()  # trajectory: one entry per look taken
    infrastructure: str | None = None  # why the run is not trusted (too many failed requests): exit 4, no verdict
    on_margin: Mapping[str, Any] | None = None  # the futility stop's facts (`margin_facts`), when it stopped so
    planning: Mapping[str, Any] | None = None  # undecided at the plan's end: a *new* compare's size (`new_compare`)

    @property
    def exit_code(self) -> int:
        return 4 if self.infrastructure else EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        """report.json form; non-finite numbers become null."""
        out = {
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "infrastructure": self.infrastructure,
            "policy": dataclasses.asdict(self.policy),
            "criteria": [{**dataclasses.asdict(c), "label": c.label} for c in self.criteria],
        }
        if self.looks:
            out["sequential"] = {"planned_looks": self.policy.looks, "looks": list(self.looks)}
        out["on_margin"] = dict(self.on_margin) if self.on_margin else None
        out["planning"] = dict(self.planning) if self.planning else None
        return _finite(out)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def build(policy: GatePolicy, inputs: GateInputs, level: float, rng: np.random.Generator) -> list[Criterion]:
    """Every criterion before multiplicity adjustment, at one-sided `level`."""
    guard_or_primary = "primary" if policy.mode == "strict" else "guard"
    m = len(inputs.accuracy) + 9  # family size estimate for n_more on the fail side
    out: list[Criterion] = []
    for arm, counts in (("baseline", inputs.base_requests), ("candidate", inputs.cand_requests)):
        out.append(cr.failed(arm, counts, policy, level) if counts is not None else cr.not_evaluated(
            f"failed_rate_{arm}", "at_most", None, policy.max_failed_rate, "request counts not given"))
    out.extend(cr.token_criteria(inputs.tokens, inputs.coverage, policy, level, m, rng, inputs.unusable))
    out.append(cr.pooled_accuracy(inputs.accuracy, policy, level, m))
    out.extend(cr.accuracy(pairs, policy, level, m, guard_or_primary) for pairs in inputs.accuracy)
    out.extend(cr.lengths(inputs.lengths, inputs.lengths_floor, policy, level, m) if inputs.lengths is not None
               else [cr.not_evaluated("length_ratio", "within", 1 - policy.max_length_drift,
                                      1 + policy.max_length_drift, "no paired lengths")])
    if inputs.lengths is not None:
        out.append(cr.length_ks(inputs.lengths, inputs.lengths_floor, policy.max_length_ks_excess, level, m))
    bounds = {"truncation": policy.max_trunc_excess, "loop": policy.max_loop_excess,
              "repeated_bigrams": policy.max_distinct2_loss}
    out.extend(cr.rate_excess(rp, bounds[rp.name], level, m) for rp in inputs.rates)
    if inputs.cache is not None:
        out.append(cr.cache_path(inputs.cache, policy, level, m))
    if inputs.steady_speed is not None:
        out.append(cr.steady_speedup(inputs.steady_speed, policy, level, m))
    elif inputs.base_throughput is not None and inputs.cand_throughput is not None:
        out.append(cr.speedup(inputs.base_throughput, inputs.cand_throughput, policy, level, m))
    return out


def _holm_fail(pvalues: Sequence[float], alpha: float, looks: int | tuple[int, ...]) -> list[bool]:
    """Holm step-down with level α′(α/j) at step j (j hypotheses left): which are rejected."""
    order = np.argsort(pvalues, kind="stable")
    rejected = [False] * len(pvalues)
    left = len(pvalues)
    for i in order:
        if pvalues[i] < nominal_alpha(alpha / left, looks):
            rejected[i] = True
            left -= 1
        else:
            break
    return rejected


def decide(policy: GatePolicy, inputs: GateInputs, rng: np.random.Generator, *, looks: int | tuple[int, ...] = 1,
           passed_before: Mapping[str, tuple[int, Criterion]] | None = None) -> Verdict:
    """Judge every criterion at one look of the plan `looks` (a number of equally spaced looks, or
    the planned sizes of each look); Holm-adjust the fail tests; verdict.

    `passed_before`: primary criteria already shown inside at an earlier look: label → (look, the
    criterion as judged then). They stay shown, with the estimate and interval that decided them."""
    level = nominal_alpha(policy.alpha, looks)
    drafts = build(policy, inputs, level, rng)
    tested = [i for i, c in enumerate(drafts) if c.p_fail is not None]
    p_fail = [drafts[i].p_fail for i in tested]
    rejected = _holm_fail(p_fail, policy.alpha, looks)
    holm = st.holm_adjust(p_fail) if p_fail else []
    final = list(drafts)
    earlier = passed_before or {}
    for j, i in enumerate(tested):
        c = drafts[i]
        status: Status
        if rejected[j]:
            status = "fail"
        elif c.status == "pass" or (c.p_pass is not None and c.p_pass < level):
            status = "pass"
        elif c.label in earlier:
            # its own sequential test stopped when it crossed: report the look that decided it
            look, then = earlier[c.label]
            now = "—" if c.estimate is None else f"{c.estimate:.4g} [{c.ci_low:.4g}, {c.ci_high:.4g}]"
            final[i] = dataclasses.replace(then, p_fail=c.p_fail, p_fail_holm=float(holm[j]), status="pass",
                                           detail=f"shown inside at look {look} ({then.n} {then.unit}); at this look "
                                                  f"{now} on {c.n} {c.unit}; {then.detail}")
            continue
        else:
            status = c.status if c.status == "not_evaluated" else "inconclusive"
        final[i] = dataclasses.replace(c, p_fail_holm=float(holm[j]), status=status)
    final = [c if c.status == "inconclusive" else dataclasses.replace(c, n_more=None) for c in final]
    return combine(policy, tuple(final))


def combine(policy: GatePolicy, criteria: tuple[Criterion, ...], looks: tuple[dict[str, Any], ...] = ()) -> Verdict:
    """Too many failed requests (answers, or the teacher forcing the token criteria need) → no verdict
    (infrastructure, exit 4); any fail → FAIL; every primary criterion pass → PASS; else INCONCLUSIVE."""
    unhealthy = [c for c in criteria if c.infrastructure and c.status != "pass"]
    if unhealthy:
        why = "; ".join(f"{c.name.removeprefix('failed_rate_')}: {c.detail.removeprefix('infrastructure: ')}"
                        for c in unhealthy)
        return Verdict("INCONCLUSIVE", criteria, f"infrastructure: requests failed after their retries ({why})",
                       policy, looks, infrastructure=why)
    failed = [c for c in criteria if c.status == "fail"]
    primary = [c for c in criteria if c.role == "primary" and c.status != "not_evaluated"]
    open_ = [c for c in primary if c.status != "pass"]
    if failed:
        names = ", ".join(f"{c.label} (Holm p={c.p_fail_holm:.2g})" for c in failed)
        return Verdict("FAIL", criteria, f"shown outside its bound: {names}", policy, looks)
    if open_:
        return Verdict("INCONCLUSIVE", criteria, "not decided: " + ", ".join(c.label for c in open_), policy, looks)
    if not any(not c.name.startswith("failed_rate") for c in primary):
        return Verdict("INCONCLUSIVE", criteria, "no quality criterion could be evaluated", policy, looks)
    guards = [c for c in criteria if c.role == "guard" and c.status == "inconclusive"]
    tail = f"; {len(guards)} guard(s) undecided, none failed" if guards else ""
    quality = [c for c in primary if not c.name.startswith("failed_rate")]  # the run-health rates are said apart
    return Verdict("PASS", criteria, f"all {len(quality)} primary criteria shown inside their bounds, the failed-request "
                                     f"rates within theirs{tail}",
                   policy, looks)


def look_row(k: int, n_items: int, v: Verdict) -> dict[str, Any]:
    """One row of the trajectory table: each criterion's interval at this look."""
    return {"look": k, "items": n_items, "verdict": v.verdict,
            "criteria": {c.label: {"estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high,
                                   "status": c.status, "n": c.n} for c in v.criteria}}


def decide_sequence(policy: GatePolicy, looks: Sequence[tuple[int, GateInputs]], rng_seed: int,
                    planned: Sequence[int] | None = None) -> Verdict:
    """Replay the looks taken (items judged, inputs at that look), in order; the verdict of the
    first decided look, or of the last one. `planned`: the sizes of every planned look (the plan
    the levels are spent over, `look_sizes`), of which the looks taken are the first; None: `policy.looks`
    equally spaced looks. Pure: the same inputs give the same trajectory."""
    if not looks:
        raise ValueError("no look to judge")
    plan: int | tuple[int, ...] = max(policy.looks, len(looks)) if planned is None else \
        (tuple(int(n) for n in planned) if len(planned) > 1 else 1)
    passed: dict[str, tuple[int, Criterion]] = {}
    rows: list[dict[str, Any]] = []
    verdict: Verdict | None = None
    final_items = planned[-1] if planned else None
    for k, (n_items, inputs) in enumerate(looks, start=1):
        verdict = decide(policy, inputs, np.random.default_rng(rng_seed), looks=plan, passed_before=passed)
        rows.append(look_row(k, n_items, verdict))
        for c in verdict.criteria:
            if c.status == "pass" and c.role == "primary" and c.label not in passed:
                passed[c.label] = (k, c)
        if verdict.verdict != "INCONCLUSIVE" or verdict.infrastructure:
            break
        n_final = int(final_items) if final_items else round(n_items * plan / k) if isinstance(plan, int) else n_items
        facts = fu.margin_facts(verdict.criteria, verdict.policy, k, n_items, n_final)
        if facts is not None:
            verdict = dataclasses.replace(verdict, on_margin=facts, reason=fu.on_margin_reason(facts))
            rows[-1] = look_row(k, n_items, verdict)
            break
    assert verdict is not None
    last = isinstance(plan, int) and len(looks) >= plan or isinstance(plan, tuple) and len(looks) >= len(plan)
    if last and verdict.verdict == "INCONCLUSIVE" and not verdict.infrastructure:
        # the plan is spent and requests still fail above the bound: more items cannot come, so the run
        # is not trusted (run it again), never a request for more items
        above = [c for c in verdict.criteria if c.name.startswith("failed_rate") and c.status == "inconclusive"
                 and c.estimate is not None and c.estimate > policy.max_failed_rate]
        if above:
            criteria = tuple(dataclasses.replace(c, infrastructure=True) if c in above else c
                             for c in verdict.criteria)
            verdict = combine(policy, criteria)
    verdict = dataclasses.replace(verdict, looks=tuple(rows))
    spent = final_items is not None and rows[-1]["items"] >= final_items
    if verdict.verdict == "INCONCLUSIVE" and not verdict.infrastructure and (verdict.on_margin or spent):
        planning = fu.new_compare(verdict.criteria, verdict.policy.alpha, rows[-1]["items"])
        reason = verdict.reason if verdict.on_margin else verdict.reason + fu.planning_words(planning)
        verdict = dataclasses.replace(verdict, planning=planning, reason=reason)
    return dataclasses.replace(verdict, criteria=_within_pool(verdict, final_items))


def _within_pool(verdict: Verdict, final_items: int | None) -> tuple[Criterion, ...]:
    """No criterion says "n more items" past what the plan's pool holds (or once the compare stopped
    on its margin): that advice would re-judge stored answers under a larger plan (docs/ci.md); the
    verdict's `planning` says what a new compare needs instead."""
    looks = verdict.looks or ()
    judged = looks[-1]["items"] if looks else None
    left = (final_items - judged) if final_items and judged is not None else None
    return tuple(dataclasses.replace(c, n_more=None)
                 if c.n_more is not None and (verdict.on_margin or (left is not None and c.n_more > left)) else c
                 for c in verdict.criteria)
