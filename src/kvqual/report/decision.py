"""The decision in words: why the gate decided as it did and what to do next, from the criteria
in report.json (never from the free-text reason). report.html and report.md both lead with it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from kvqual.report.fmt import MISSING, fmt_bound, fmt_quantity, fmt_quantity_interval, get, quantity
from kvqual.report.summary import CRITERION_LABEL, shown_slower

_SHORT_LABEL = {
    "accuracy": "accuracy", "accuracy_pooled": "accuracy over all suites", "kl_excess": "KL beyond the A/A floor",
    "top1_loss": "same-top-1 loss", "broken_share": "the share of broken prompts", "length_ratio": "the output length ratio",
    "length_mean_ratio": "the ratio of mean output lengths", "truncation_excess": "the truncation rate",
    "loop_excess": "the repetition-loop rate", "distinct2_loss": "the outputs' distinct-2 diversity",
    "length_ks_excess": "the shape of the length distribution", "failed_rate_baseline": "the baseline's failed-request rate",
    "failed_rate_candidate": "the candidate's failed-request rate", "speedup": "the throughput ratio",
    "cache_path": "the cache path (warm against cold)",
}
_FAIL_HINT = {
    "kl_excess": "its token distributions moved, so check the candidate's KV-cache scales (1.0 everywhere means "
                 "none were loaded) and its attention kernel",
    "accuracy": "its answers got worse, so read the flipped answers among the samples below",
    "length_ratio": "its outputs changed length, so look for runaway or cut-off outputs among the samples below",
    "truncation_excess": "more of its outputs ran to max_tokens, so look for runaway outputs among the samples below",
    "loop_excess": "more of its outputs loop, so look for repetition among the samples below",
    "distinct2_loss": "its outputs repeat themselves more, so look for repeated phrases among the samples below",
    "length_ks_excess": "its output lengths are distributed differently (some longer, some shorter), so compare "
                        "the length distributions in report.html and look for runaway or cut-off outputs",
    "failed_rate": "requests failed, so read that server's log and run again",
    "speedup": "it is not as much faster as min_speedup asks",
    "cache_path": "answers served from its prefix cache differ from the same prompts computed fresh, so check "
                  "how cached blocks are reused (prefix caching, the hierarchical cache's host tier) with this KV dtype",
}


def short_label(c: Mapping[str, Any]) -> str:
    """A criterion named for a sentence: 'accuracy on arith', 'KL beyond the A/A floor'."""
    name = str(c.get("name") or "?")
    text = _SHORT_LABEL.get(name, CRITERION_LABEL.get(name, name))
    return f"{text} on {c['suite']}" if c.get("suite") and name == "accuracy" else text


def reading(c: Mapping[str, Any]) -> str:
    """'−2.78 points [−8.27, +4.57]': a criterion's estimate and interval in its units."""
    q = quantity(str(c.get("name") or ""))
    ci = fmt_quantity_interval(c.get("ci_low"), c.get("ci_high"), q)
    return fmt_quantity(c.get("estimate"), q) + ("" if ci == MISSING else f" {ci}")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(frozen=True)
class Decision:
    """The verdict in two sentences: why the gate decided so, and what to do next."""

    verdict: str
    why: str
    next_step: str


def _hint(name: str) -> str:
    for key in ("kl_excess", "top1_loss", "accuracy", "length_ratio", "truncation_excess", "loop_excess",
                "distinct2_loss", "length_ks_excess", "failed_rate", "speedup", "cache_path"):
        if name.startswith(key):
            return _FAIL_HINT["kl_excess" if key == "top1_loss" else key]
    return "read the criteria and samples below"


def _gap(c: Mapping[str, Any]) -> str | None:
    """How far a criterion's estimate sits from the bound it must be shown inside, in its units."""
    est, lo, hi = c.get("estimate"), c.get("bound_low"), c.get("bound_high")
    if not isinstance(est, (int, float)):
        return None
    ends = [abs(est - b) for b in (lo, hi) if isinstance(b, (int, float))]
    return fmt_quantity(min(ends), quantity(str(c.get("name") or "")), signed=False) if ends else None


def minutes_per_item(report: Mapping[str, Any], judged: int | None) -> float | None:
    """Wall minutes the compare spent per item judged, both arms and the A/A replicate together (its
    runs' first start to last finish): the rate a larger compare on these servers would run at."""
    runs = [r for r in (get(report, "runs") or {}).values() if isinstance(r, Mapping)]
    starts = [r["started_at"] for r in runs if isinstance(r.get("started_at"), (int, float))]
    ends = [r["finished_at"] for r in runs if isinstance(r.get("finished_at"), (int, float))]
    if not (judged and starts and ends) or max(ends) <= min(starts):
        return None
    return (max(ends) - min(starts)) / 60 / judged


def _duration(minutes: float) -> str:
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h" if minutes < 48 * 60 \
        else f"{minutes / 60 / 24:.0f} days"


def _more_items(report: Mapping[str, Any], c: Mapping[str, Any], others: int) -> str:
    """What more data would decide the largest open criterion, priced at this compare's rate, and
    whether the suites hold that many items: an estimate a hair from its bound asks for more items
    than any suite holds, which is not a plan but a finding (the effect sits on the margin)."""
    seq = get(report, "verdict", "sequential") or {}
    judged = (seq.get("sizes") or [None])[len(seq.get("looks") or [1]) - 1] if seq.get("looks") else None
    available = sum(int(s.get("n_items") or 0) for s in get(report, "runs", "baseline", "suites") or [])
    n, unit = int(c["n_more"]), c.get("unit") or "items"
    rate = minutes_per_item(report, judged if isinstance(judged, int) else None)
    cost = f" (about {_duration(n * rate)} at this compare's rate)" if rate and unit == "items" else ""
    of = f", the largest of {others + 1} estimates," if others else ""
    left = available - judged if isinstance(judged, int) and available else None
    if left is not None and unit == "items" and n > left:
        gap = _gap(c)
        margin = f"its estimate sits {gap} from its bound {fmt_bound(c)}, " if gap else ""
        return (f"No size these suites allow decides {short_label(c)}: {margin}and about {n:,} more items{of} "
                f"would be needed{cost}, where {left:,} remain. The effect is on the margin: decide whether a "
                f"difference that small matters before running more; nothing was shown outside its bound.")
    where = ""
    if isinstance(judged, int) and available:
        # which limit stopped it: a budget (the same command again takes the next look), or --max-items;
        # read from the field the judge writes (the stop reason is prose for people)
        budget = {"max_minutes": "--max-minutes", "budget_tokens": "--budget-tokens"}.get(seq.get("budget") or "")
        if not (budget and judged < available):
            # a larger --max-items would judge the stored answers under another plan: never advised (issue 51)
            total = judged + n
            cost = f" (about {_duration(total * rate)} at this compare's rate)" if rate and unit == "items" else ""
            return (f"A new compare (another --seed, or more suite items) of about {total:,} {unit} in all{of}{cost} "
                    f"would decide {short_label(c)} at this estimate; this compare's plan ended at {judged:,} of "
                    f"{available:,} items and its answers are not judged again under a larger one; nothing was "
                    "shown outside its bound.")
        where = (f" (raise {budget}, or run the same command again: it continues with the next look; "
                 f"{judged:,} of {available:,} were judged)")
    return (f"Run about {n:,} more {unit}{of}{cost} to decide "
            f"{short_label(c)}{where}; nothing was shown outside its bound.")


def decision(report: Mapping[str, Any]) -> Decision:
    """Why and what next, from the criteria in report.json (never from the free-text reason)."""
    verdict = str(get(report, "verdict", "verdict") or "UNKNOWN")
    crits = [c for c in get(report, "verdict", "criteria") or [] if isinstance(c, Mapping)]
    cand = str(get(report, "runs", "candidate", "target") or "the candidate")
    failed = sorted((c for c in crits if c.get("status") == "fail"),
                    key=lambda c: (c.get("p_fail_holm") is None, c.get("p_fail_holm") or 0.0))
    primary = [c for c in crits if c.get("role", "primary") == "primary" and c.get("status") != "not_evaluated"]
    open_ = [c for c in primary if c.get("status") != "pass"]
    if verdict == "FAIL" and failed:
        first = failed[0]
        more = "; also outside: " + ", ".join(short_label(c) for c in failed[1:]) if failed[1:] else ""
        return Decision(verdict, _sentence(f"{short_label(first)} is outside its bound: {reading(first)}, "
                                           f"bound {fmt_bound(first)}{more}."),
                        f"Do not ship {cand}: {_hint(str(first.get('name')))}.")
    if verdict == "PASS":
        guards = [c for c in crits if c.get("role") == "guard" and c.get("status") == "inconclusive"]
        tail = f" ({len(guards)} guard{'s' if len(guards) != 1 else ''} undecided, none outside)" if guards else ""
        # counted as the report lists them: the failed-request rates are run health, apart from the quality criteria
        quality = [c for c in primary if not str(c.get("name") or "").startswith("failed_rate")]
        health = len(primary) - len(quality)
        tail += ("; both failed-request rates are within theirs" if health == 2 else
                 "; the failed-request rate is within its bound" if health == 1 else "")
        ratio = get(report, "steady_speed", "ratio", "estimate") if report.get("steady_speed") else \
            get(report, "speed", "ratio", "estimate")  # --speed-from: the flag is on the load's ratio
        slower = (f", but it ran at {fmt_quantity(ratio, 'ratio')} the baseline's throughput: read the speed "
                  "section first") if shown_slower(report) else ""
        return Decision(verdict, f"All {len(quality)} primary criteria are shown inside their bounds{tail}.",
                        f"{cand} can ship on these criteria{slower}.")
    if verdict == "INCONCLUSIVE" and get(report, "verdict", "infrastructure"):
        return Decision(verdict, _sentence(f"requests failed after their retries: "
                                           f"{get(report, 'verdict', 'infrastructure')}."),
                        "Run the same command again: it keeps every answer on disk and sends the failed requests "
                        "again; if they fail again, read the servers' logs.")
    if verdict == "INCONCLUSIVE":
        if not open_:
            return Decision(verdict, "No quality criterion could be evaluated: only request failures were judged.",
                            "Give the gate something to judge: suites with answers, or teacher forcing for the "
                            "token criteria, then run again.")
        stuck = [c for c in open_ if c.get("n_more") is None]
        ranked = sorted(open_, key=lambda c: -(c.get("n_more") or 0))
        first = stuck[0] if stuck else ranked[0]
        others = len(open_) - 1
        tail = "; also undecided: " + ", ".join(short_label(c) for c in open_ if c is not first) if others else ""
        if first.get("estimate") is None:
            why = _sentence(f"{short_label(first)} has no estimate: "
                            f"{str(first.get('detail') or 'no data').split(';')[0]}{tail}.")
        else:
            why = _sentence(f"{short_label(first)} is not decided: {reading(first)} straddles its bound "
                            f"{fmt_bound(first)}{tail}.")
        margin = get(report, "verdict", "on_margin")
        if isinstance(margin, Mapping) and margin.get("criteria"):
            return _on_margin(margin, tail)
        planned = (get(report, "verdict", "planning", "criteria") or {}).get(first.get("label"))
        if first.get("n_more") is None and isinstance(planned, Mapping) and first.get("estimate") is not None:
            judged = get(report, "verdict", "planning", "items")
            new = (f"a new compare (another --seed, or more suite items) needs about {planned['power_80']:,} items in all "
                   f"for 80% power and {planned['power_90']:,} for 90% at this estimate" if planned.get("power_80")
                   and planned.get("power_90") else "no feasible new compare decides it at this estimate")
            return Decision(verdict, why, _sentence(f"this compare's plan ended at {judged:,} items; {new}; its "
                                                    "answers are not judged again under a larger plan; nothing was "
                                                    "shown outside its bound."))
        if stuck:
            return Decision(verdict, why, f"Fix what left {short_label(first)} undecided (more items will not), "
                                          "then run again; nothing was shown outside its bound.")
        return Decision(verdict, why, _more_items(report, first, others))
    return Decision(verdict, str(get(report, "verdict", "reason") or "no reason given"),
                    "Run the compare again: this report holds no verdict.")


def _on_margin(margin: Mapping[str, Any], tail: str) -> Decision:
    """The futility stop (gate/futility.py) in words: which criterion sits on its margin, how precise
    that margin is, and what a *new* compare would need (never more items in this one)."""
    first = margin["criteria"][0]
    plan = first.get("new_compare_items") or {}
    q = quantity(str(first.get("name") or ""))
    ci = fmt_quantity_interval(first.get("ci_low"), first.get("ci_high"), q)
    bound = first.get("bound_low") if first.get("bound_low") is not None else first.get("bound_high")
    why = _sentence(f"{short_label(first)} is on its margin: {fmt_quantity(first.get('estimate'), q)} {ci} holds "
                    f"its bound {fmt_quantity(bound, q)} ({first.get('bound_origin') or 'its bound'}){tail}.")
    within = (f"the plan's last look ({margin['final_items']:,} items) would decide it with probability "
              f"{margin['power']:.2f} at this estimate, so the compare stopped at {margin['items']:,} items"
              if margin["final_items"] > margin["items"] else f"all {margin['items']:,} items of the plan are judged")
    new = (f"a new compare (another --seed, or more suite items) needs about {plan['power_80']:,} items in all for 80% "
           f"power and {plan['power_90']:,} for 90% at this estimate" if plan.get("power_80") and plan.get("power_90") else
           "no feasible new compare decides it at this estimate")
    return Decision("INCONCLUSIVE", why, _sentence(f"{within}; {new}. Decide whether a difference this close to the "
                                                   "margin matters, or calibrate the margin on your model "
                                                   "(kvqual calibrate) before the next compare, never to flip this "
                                                   "one; nothing was shown outside its bound."))
