"""junit.xml: one testcase per gate criterion, so any CI system can show what failed.

Mapping (documented in docs/ci.md): classname = the criterion's suite or "overall";
pass → plain testcase; fail → <failure> whose message carries estimate, CI and bound (in the
units report.md shows: accuracy in points, KL in nats per token, ratios as ×);
inconclusive → <skipped message="inconclusive: …"> (not a failure: the job's exit code 3
decides how CI treats it); not_evaluated → <skipped message="not evaluated: …">.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from kvqual.report import fmt as F
from kvqual.report import summary as S


def _message(row: S.CriterionRow) -> str:
    text = f"estimate {row.estimate}, CI {row.ci}, bound {row.bound}"
    return f"{text} — {row.detail}" if row.detail else text


def build_junit(report: Mapping[str, Any]) -> ET.Element:
    """The <testsuites> tree for a report (one <testsuite> named 'kvqual')."""
    rows = S.criterion_rows(report)
    verdict, reason = S.verdict_line(report)
    failures = sum(r.status == "fail" for r in rows)
    skipped = sum(r.status in ("inconclusive", "not_evaluated") for r in rows)
    counts = {"tests": str(len(rows)), "failures": str(failures), "errors": "0",
              "skipped": str(skipped), "time": "0"}
    root = ET.Element("testsuites", {"name": f"kvqual {S.title(report)}", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": "kvqual", **counts})
    props = ET.SubElement(suite, "properties")
    for name, value in (("verdict", verdict), ("reason", reason), ("exit_code", S.exit_code(report)),
                        ("command", str(report.get("command") or "")),
                        ("created_at", str(report.get("created_at") or ""))):
        ET.SubElement(props, "property", {"name": name, "value": value})
    for row in rows:
        case = ET.SubElement(suite, "testcase", {"classname": row.suite, "name": row.name, "time": "0"})
        message = _message(row)
        if row.status == "fail":
            failure = ET.SubElement(case, "failure", {"message": message, "type": "kvqual.fail"})
            failure.text = f"{row.label} ({row.suite}): {message}; n={row.n}"
        elif row.status == "inconclusive":
            more = f"; about {row.n_more} more {row.unit} would decide" if row.n_more != F.MISSING else ""
            ET.SubElement(case, "skipped", {"message": f"inconclusive: {message}{more}"})
        elif row.status != "pass":
            ET.SubElement(case, "skipped", {"message": f"not evaluated: {row.detail or 'no data'}"})
        out = ET.SubElement(case, "system-out")
        out.text = f"{row.label}: {message}; n={row.n}"
    return root


def render_junit(report: Mapping[str, Any]) -> str:
    """junit.xml text (UTF-8, XML declaration, indented; stable for the same input)."""
    root = build_junit(report)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
