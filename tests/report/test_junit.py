"""junit.xml: one testcase per criterion; FAIL → failure with estimate and bound."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from kvqual.report.junit import render_junit


def _cases(report):
    root = ET.fromstring(render_junit(report).encode("utf-8"))
    assert root.tag == "testsuites"
    return root, root.findall("./testsuite/testcase")


def test_one_testcase_per_criterion_with_suite_as_classname(report):
    root, cases = _cases(report)
    crits = report["verdict"]["criteria"]
    assert len(cases) == len(crits) == 7
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        (k["suite"] or "overall", k["name"]) for k in crits]
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped"), suite.get("errors")) == ("7", "1", "2", "0")


def test_fail_carries_estimate_and_bound(report):
    _, cases = _cases(report)
    failures = [(c.get("name"), c.find("failure")) for c in cases if c.find("failure") is not None]
    assert [name for name, _ in failures] == ["kl_excess"]
    message = failures[0][1].get("message")
    # the same display units as report.md: KL in nats per token
    assert re.match(r"estimate 0\.0410* nats/token, CI \[0\.0340*, 0\.0490*\] \(90%\), bound ≤ 0\.03 nats/token — ",
                    message), message


def test_inconclusive_and_not_evaluated_are_skipped_not_failed(report):
    _, cases = _cases(report)
    skipped = {c.get("name"): c.find("skipped").get("message") for c in cases if c.find("skipped") is not None}
    assert set(skipped) == {"accuracy", "speedup"}
    assert re.match(r"inconclusive: estimate [−-]5\.00 points, ", skipped["accuracy"]), skipped["accuracy"]
    assert skipped["accuracy"].endswith("; about 140 more items would decide")
    assert skipped["speedup"] == "not evaluated: speed not measured (no min_speedup)"
    passed = [c for c in cases if c.find("failure") is None and c.find("skipped") is None]
    assert len(passed) == 4


def test_verdict_is_a_property_and_output_is_deterministic(report):
    root, _ = _cases(report)
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["verdict"] == "FAIL" and props["exit_code"] == "1"
    assert render_junit(report) == render_junit(report)


def test_nulls_do_not_crash(null_report):
    root, cases = _cases(null_report)
    assert len(cases) == 1 and cases[0].get("classname") == "overall"
    assert cases[0].find("skipped").get("message") == "not evaluated: no data"


def test_inconclusive_names_the_unit_it_needs_more_of(report):
    """A criterion clustered by shared context needs more *contexts*, not more items."""
    report["verdict"]["criteria"][0]["unit"] = "contexts"
    _, cases = _cases(report)
    skipped = next(c.find("skipped").get("message") for c in cases if c.get("name") == "accuracy")
    assert skipped.endswith("; about 140 more contexts would decide")
