"""An interval wholly outside its bound that the gate left INCONCLUSIVE (its fail test did not
survive Holm's adjustment) says why in every report, instead of sitting silently under the legend
"one shown outside fails the candidate"."""

from __future__ import annotations

import copy

from markupsafe import escape

from kvqual.report import summary as S
from kvqual.report.console import console_summary
from kvqual.report.forest import forest_row
from kvqual.report.html import render_html
from kvqual.report.markdown import render_markdown


def _current(report):
    """The sample with the keys today's report.json carries for the console (label, role)."""
    r = copy.deepcopy(report)
    for c in r["verdict"]["criteria"]:
        c["label"] = f"{c['name']}[{c['suite']}]" if c.get("suite") else c["name"]
        c.setdefault("role", "primary")
    return r


def _outside(report):
    """The sample's arith accuracy moved wholly below its −5-point bound, undecided after Holm."""
    r = _current(report)
    r["verdict"]["verdict"] = "INCONCLUSIVE"
    acc = next(c for c in r["verdict"]["criteria"] if c["name"] == "accuracy")
    acc.update(status="inconclusive", estimate=-0.5, ci_low=-0.774, ci_high=-0.051, p_fail=0.004,
               p_fail_holm=0.052, level=0.0137, role="guard")
    next(c for c in r["verdict"]["criteria"] if c["name"] == "kl_excess")["status"] = "pass"
    return r, acc


def test_the_note_explains_the_adjustment_only_where_the_interval_is_outside(report):
    r, acc = _outside(report)
    note = S.holm_note(acc)
    assert note == ("outside its bound before the multiple-testing adjustment: its fail test's p-value 0.00400 is "
                    "0.0520 after Holm's adjustment over every criterion, above the level 0.0137: not shown "
                    "outside, so not a FAIL")
    assert S.holm_note({**acc, "ci_high": 0.01}) is None  # straddles the bound: the usual undecided
    assert S.holm_note({**acc, "status": "fail"}) is None
    within = {**acc, "direction": "within", "bound_low": 0.9, "bound_high": 1.1, "ci_low": 1.19, "ci_high": 2.02}
    assert S.holm_note(within) is not None  # a length ratio of 1.55× [1.19, 2.02] against [0.9, 1.1]


def test_every_report_shows_it(report):
    r, acc = _outside(report)
    text = console_summary(r)
    row = next(line for line in text.splitlines() if line.startswith("accuracy"))
    assert row.endswith("INCONCLUSIVE†")
    assert f"† accuracy[arith]: {S.holm_note(acc)}" in text
    assert S.holm_note(acc) in render_markdown(r)
    assert forest_row(acc).holm == S.holm_note(acc)
    assert str(escape(S.holm_note(acc))) in render_html(r)
    assert "†" not in console_summary(_current(report))  # the sample as it is has no such criterion
