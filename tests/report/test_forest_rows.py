"""The forest plot's rows and the words beside the verdict: units, scales, and what to do next."""

from __future__ import annotations

import copy

import pytest

from kvqual.report import decision as D
from kvqual.report import fmt as F
from kvqual.report.forest import forest_row, forest_rows


def _crit(**kw):
    base = {"name": "accuracy", "suite": None, "status": "inconclusive", "direction": "at_least", "bound_low": -0.05,
            "bound_high": None, "estimate": -0.0185, "ci_low": -0.0827, "ci_high": 0.0457, "ci_level": 0.96,
            "n": 108, "n_more": 342, "unit": "items", "role": "primary", "detail": ""}
    return {**base, **kw}


@pytest.mark.parametrize("value, kw, text", [
    (-0.027777, {}, "−0.0278"), (1.0026, {}, "1.00"), (1.0026, {"trim": True}, "1"), (0.00554, {}, "0.00554"),
    (1234.5, {}, "1,230"), (9.996, {}, "10.0"), (0.0, {"signed": True}, "0"), (4.57, {"signed": True}, "+4.57"),
    (float("inf"), {}, "∞"), (1e-5, {}, "1.00e−05"),
])
def test_three_significant_figures_with_a_real_minus(value, kw, text):
    assert F.sig3(value, **kw) == text


def test_criteria_read_in_their_units():
    assert D.reading(_crit()) == "−1.85 points [−8.27, +4.57]"
    assert F.fmt_bound(_crit()) == "≥ −5 points"
    kl = _crit(name="kl_excess", direction="at_most", bound_low=None, bound_high=0.012, estimate=0.005544,
               ci_low=0.004821, ci_high=0.006674)
    assert (D.reading(kl), F.fmt_bound(kl)) == ("0.00554 nats/token [0.00482, 0.00667]", "≤ 0.012 nats/token")
    top1 = _crit(name="top1_loss", direction="at_most", bound_low=None, bound_high=0.042, estimate=0.0255,
                 ci_low=0.0183, ci_high=0.0344)
    assert (D.reading(top1), F.fmt_bound(top1)) == ("+2.55 points [+1.83, +3.44]", "≤ 4.2 points")
    failed = _crit(name="failed_rate_candidate", direction="at_most", bound_low=None, bound_high=0.01, estimate=0.0,
                   ci_low=0.0, ci_high=0.0313)
    assert (D.reading(failed), F.fmt_bound(failed)) == ("0% [0%, 3.13%]", "≤ 1%")
    length = _crit(name="length_ratio", direction="within", bound_low=0.9, bound_high=1.1, estimate=1.0026,
                   ci_low=0.9563, ci_high=1.0512)
    assert (D.reading(length), F.fmt_bound(length)) == ("1.00× [0.956, 1.05]", "within [0.9, 1.1]")
    assert D.reading(_crit(ci_low=None)) == "−1.85 points (−∞, +4.57]"


def test_a_row_holds_its_interval_its_bound_and_no_change_on_one_scale():
    row = forest_row(_crit())
    left, width = row.ci
    assert 0 <= left and left + width <= 100 and width > 50  # the interval fills the row, not a sliver
    (bound,) = row.bounds
    assert bound.text == "−5" and 0 < bound.at < left + width  # the bound is drawn inside the scale
    assert row.zone == (bound.at, 100 - bound.at)  # at_least: inside the bound is to its right
    assert row.reference.text == "0" and left < row.reference.at < left + width
    assert all(0 <= t.at <= 100 for t in row.ticks) and row.ticks
    assert not any(t.text == "−5" for t in row.ticks)  # the bound has its own label


def test_a_dip_far_inside_the_bound_does_not_fill_the_scale():
    """top-1 loss 0.3 points against a bound 4.2 points away: the axis runs to the bound, so the
    interval is a short bar near 0, not a dramatic zoom (the old 0.978–1.000 axis)."""
    row = forest_row(_crit(name="top1_loss", direction="at_most", bound_low=None, bound_high=0.042, estimate=0.003,
                           ci_low=0.001, ci_high=0.005, status="pass"))
    assert row.ci[1] < 15 and row.bounds[0].at > 85
    assert row.zone == (0.0, row.bounds[0].at)  # at_most: inside is left of the bound


def test_unbounded_and_missing_intervals():
    open_row = forest_row(_crit(ci_low=None))
    assert open_row.open_low and open_row.ci[0] == 0.0
    empty = forest_row(_crit(name="kl_excess", estimate=None, ci_low=None, ci_high=None,
                             detail="token metrics usable on 0 of 31 pairs"))
    assert empty.ci is None and empty.note == "token metrics usable on 0 of 31 pairs"


def test_rows_are_grouped_primary_guard_health_speed(report):
    groups = forest_rows(report)
    assert [title.split(":")[0] for title, _ in groups] == ["Primary criteria", "Run health", "Speed"]
    r = copy.deepcopy(report)
    r["verdict"]["criteria"][0]["role"] = "guard"
    assert [len(rows) for _, rows in forest_rows(r)] == [3, 1, 2, 1]


def _verdict(report, verdict: str, **changes):
    r = copy.deepcopy(report)
    r["verdict"]["verdict"] = verdict
    for name, fields in changes.items():
        next(c for c in r["verdict"]["criteria"] if c["name"] == name).update(fields)
    return r


def test_why_and_what_next_for_each_verdict(report):
    fail = D.decision(report)
    assert fail.why == ("KL beyond the A/A floor is outside its bound: 0.0410 nats/token [0.0340, 0.0490], "
                        "bound ≤ 0.03 nats/token.")
    assert fail.next_step.startswith("Do not ship fp8: its token distributions moved")

    undecided = D.decision(_verdict(report, "INCONCLUSIVE", kl_excess={"status": "pass"}))
    assert undecided.why == ("Accuracy on arith is not decided: −5.00 points [−16.0, +6.00] straddles its bound "
                             "≥ −5 points.")
    assert undecided.next_step == ("Run about 140 more items to decide accuracy on arith; nothing was shown "
                                   "outside its bound.")

    passed = D.decision(_verdict(report, "PASS", kl_excess={"status": "pass"}, accuracy={"status": "pass"}))
    assert passed.why == "All 4 primary criteria are shown inside their bounds; both failed-request rates are within theirs."
    assert passed.next_step == "fp8 can ship on these criteria."
    slow = _verdict(report, "PASS", kl_excess={"status": "pass"}, accuracy={"status": "pass"})
    slow["speed"]["ratio"].update(estimate=0.59, ci_low=0.5, ci_high=0.7)
    assert "but it ran at 0.590× the baseline's throughput" in D.decision(slow).next_step


def test_undecided_without_data_says_what_to_fix_not_how_many_items(report):
    r = _verdict(report, "INCONCLUSIVE", kl_excess={"status": "inconclusive", "estimate": None, "ci_low": None,
                                                    "ci_high": None, "n_more": None,
                                                    "detail": "token metrics usable on 0 of 31 pairs; more"})
    d = D.decision(r)
    assert d.why.startswith("KL beyond the A/A floor has no estimate: token metrics usable on 0 of 31 pairs; "
                            "also undecided: accuracy on arith")
    assert d.next_step.startswith("Fix what left KL beyond the A/A floor undecided (more items will not)")


def _sequential(report, *, judged: int, available: int, minutes: float, n_more: int):
    """An INCONCLUSIVE report whose accuracy needs `n_more` items, `judged` of `available` judged in
    `minutes` of wall time."""
    r = _verdict(report, "INCONCLUSIVE", kl_excess={"status": "pass"}, accuracy={"n_more": n_more})
    r["verdict"]["sequential"] = {"sizes": [judged], "looks": [{"look": 1}]}
    r["runs"]["baseline"].update(suites=[{"name": "arith", "n_items": available}], started_at=1000.0,
                                 finished_at=1000.0 + minutes * 60)
    r["runs"]["candidate"].update(started_at=1001.0, finished_at=1000.0 + minutes * 60)
    return r


def test_more_items_are_priced_at_the_compares_own_rate(report):
    d = D.decision(_sequential(report, judged=124, available=2108, minutes=2.0, n_more=342))
    # never "raise --max-items" (issue 51): that would judge these stored answers under another plan
    # 2 minutes for 124 items: a new compare of 466 items is ~7.5 minutes
    assert d.next_step == ("A new compare (another --seed, or more suite items) of about 466 items in all (about "
                           "8 min at this compare's rate) would decide accuracy on arith at this estimate; this "
                           "compare's plan ended at 124 of 2,108 items and its answers are not judged again under "
                           "a larger one; nothing was shown outside its bound.")


def test_a_budget_stop_names_the_budget_not_max_items(report):
    """The README's run stopped on max_minutes; its advice once said 'raise --max-items', which was not set."""
    r = _sequential(report, judged=252, available=2108, minutes=4.9, n_more=249)
    # as the judge writes it (judge/record.py: LookPlan.stop_reason, and the budget as a field)
    r["verdict"]["sequential"].update(stop="stopped at look 2 of 5 (252 items): max_minutes 5: the next look (511 "
                                      "items) would take ~4.9 more minutes at the rate so far, past the budget",
                                      budget="max_minutes")
    assert D.decision(r).next_step == (
        "Run about 249 more items (about 5 min at this compare's rate) to decide accuracy on arith (raise "
        "--max-minutes, or run the same command again: it continues with the next look; 252 of 2,108 were "
        "judged); nothing was shown outside its bound.")
    r["verdict"]["sequential"].update(stop="stopped at look 2 of 5 (252 items): budget_tokens 1000 reached (1203 "
                                      "generated)", budget="budget_tokens")
    assert "(raise --budget-tokens, or run the same command again" in D.decision(r).next_step


def test_more_items_than_the_suites_hold_is_a_margin_not_a_plan(report):
    """README command 1 once advised 'Run about 44,811 more items' with 1,984 left: no plan at all."""
    d = D.decision(_sequential(report, judged=124, available=2108, minutes=2.0, n_more=44_811))
    assert d.next_step.startswith("No size these suites allow decides accuracy on arith: its estimate sits 0 points "
                                  "from its bound ≥ −5 points, and about 44,811 more items would be needed (about "
                                  "12.0 h at this compare's rate), where 1,984 remain. The effect is on the margin")
    assert "Run about" not in d.next_step


def test_every_criterion_the_gate_emits_reads_as_words_not_a_raw_name():
    """Issue 53: `length_mean_ratio` showed as a raw identifier among the labels of report.html. Every
    criterion a gate with all its inputs emits has a label and a short label of its own."""
    import numpy as np
    from test_gate import RNG, _accuracy, _lengths, _ok_requests, _tokens

    from kvqual.gate import GateInputs, GatePolicy, RatePairs, decide
    from kvqual.report.summary import CRITERION_LABEL

    n = 200
    zero = np.zeros(n)
    rates = tuple(RatePairs(name, zero, zero, None, zero, zero) for name in ("truncation", "loop", "repeated_bigrams"))
    inputs = GateInputs(accuracy=(_accuracy(n, 2, 2, "a"), _accuracy(n, 2, 2, "b")), tokens=_tokens(n),
                        lengths=_lengths(n), lengths_floor=_lengths(n, seed=3), rates=rates, **_ok_requests(n))
    names = {c.name for c in decide(GatePolicy(min_speedup=1.1), inputs, RNG(0)).criteria}
    assert {"length_mean_ratio", "length_ks_excess", "distinct2_loss", "accuracy_pooled"} <= names, names
    assert names <= set(CRITERION_LABEL) and names <= set(D._SHORT_LABEL), names - set(CRITERION_LABEL)
