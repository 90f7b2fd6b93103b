"""report.md: the verdict and its evidence as GitHub Markdown, ready to paste as a PR comment.

Order follows what a reviewer asks: verdict and why, which criteria decided it, what was
compared (targets, models, KV dtypes and scales, suites), metrics against the A/A floor,
speed, and the command to reproduce. Long tables are cut so the text stays under GitHub's
comment limit (65,536 characters), with a note saying what was left out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvqual.report import summary as S

GITHUB_COMMENT_LIMIT = 65_536
_ROW_CAPS: tuple[int | None, ...] = (None, 200, 100, 50, 20, 8, 3)
_STATUS_ORDER = {"fail": 0, "inconclusive": 1, "pass": 2, "not_evaluated": 3}


def cell(text: object) -> str:
    """Text made safe inside a Markdown table cell: no pipes, newlines or raw HTML."""
    value = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return value.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def inline(text: object) -> str:
    """Free text on one Markdown line with HTML neutralised (names, reasons, warnings)."""
    return cell(text)


def code_block(text: str) -> str:
    """A fenced block whose fence is longer than any backtick run inside the text."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}sh\n{text}\n{fence}"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A GitHub table; every cell is escaped with `cell`."""
    lines = ["| " + " | ".join(cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def _capped(rows: list[Any], cap: int | None, what: str) -> tuple[list[Any], list[str]]:
    if cap is None or len(rows) <= cap:
        return rows, []
    note = f"_… {len(rows) - cap} more {what} not shown (size limit); see report.html or report.json._"
    return rows[:cap], ["", note]


def _criteria_section(report: Mapping[str, Any], cap: int | None) -> list[str]:
    rows = S.criterion_rows(report)
    if not rows:
        return ["### Criteria", "", "_No criteria were evaluated._"]
    if cap is not None and len(rows) > cap:
        rows = sorted(rows, key=lambda r: _STATUS_ORDER.get(r.status, 4))
    rows, note = _capped(rows, cap, "criteria (failing and inconclusive listed first)")
    body = table(
        ["Criterion", "Suite", "Role", "Estimate", "CI", "Bound", "Status", "n", "Detail"],
        ([r.label, r.suite, r.role, r.estimate, r.ci, r.bound, f"{r.icon} {r.status}"
          + (f" (≈{r.n_more} more {r.unit} would decide)" if r.status == "inconclusive"
             and r.n_more != S.MISSING else ""), f"{r.n} {r.unit}", r.detail] for r in rows),
    )
    out = ["### Criteria", ""] + body + note
    header, looks = S.trajectory_rows(report)
    if len(looks) > 0:
        out += ["", "**Sequential looks** (each primary criterion's interval as items accumulate):", ""]
        out += table(header, looks)
    return out


def _compared_section(report: Mapping[str, Any], cap: int | None) -> list[str]:
    out = ["### What was compared", ""]
    out += table(["", "Baseline", "Candidate", "A/A replicate (baseline again)"],
                 ([r.label, r.baseline, r.candidate, r.aa] for r in S.arm_rows(report)))
    suites, note = _capped(S.suite_rows(report), cap, "suites")
    out += ["", "**Suites** (pairs are matched by suite, item id and repeat):", ""]
    if suites:
        out += table(["Suite", "Items", "sha256", "A/B pairs", "A/A floor pairs", "Dropped pairs"],
                     ([s.name, s.n_items, s.sha256, s.ab_pairs, s.aa_pairs, s.dropped_pairs]
                      for s in suites)) + note
    else:
        out.append("_No suite information recorded._")
    tf = report.get("teacher_forcing") or {}
    enabled = tf.get("enabled")
    tf_text = "on" if enabled else ("off" if enabled is False else S.NOT_MEASURED)
    if tf.get("note"):
        tf_text += f" — {tf['note']}"
    out += ["", f"- Teacher-forced token metrics: {inline(tf_text)}"]
    if report.get("allow_mismatch"):
        out.append("- ⚠️ `--allow-mismatch` was set: the arms may not run the configured models/dtypes.")
    return out


def _metrics_section(report: Mapping[str, Any], cap: int | None) -> list[str]:
    rows, note = _capped(S.metric_rows(report), cap, "metric rows")
    if not rows:
        return []
    return (["### Metrics against the A/A noise floor", ""]
            + table(["Suite", "Metric", "A/B (base vs cand)", "A/A floor (base vs base)"],
                    ([r.suite, r.metric, r.ab, r.aa] for r in rows)) + note)


def _speed_section(report: Mapping[str, Any]) -> list[str]:
    rows = S.speed_rows(report)
    if not rows:
        return ["### Throughput", "", "_Not measured._"]
    ratio = rows[-1]
    body = table(["", "Baseline", "Candidate"], ([r.label, r.baseline, r.candidate] for r in rows[:-1]))
    return (["### Throughput", ""] + body
            + ["", f"Throughput ratio (cand / base): **{cell(ratio.baseline)}**, CI {cell(ratio.candidate)}"])


def _warnings_section(report: Mapping[str, Any], cap: int | None) -> list[str]:
    warnings = [str(w) for w in report.get("warnings") or []]
    if not warnings:
        return []
    shown, note = _capped(warnings, cap, "warnings")
    return ["### Warnings", ""] + [f"- {inline(w)}" for w in shown] + note


def _render(report: Mapping[str, Any], cap: int | None) -> str:
    verdict, icon, reason = S.verdict_line(report)
    lines = [
        f"## {icon} kvqual: **{verdict}** — {inline(S.title(report))}",
        "",
        f"**{inline(reason)}**",
        "",
        f"Exit code {S.exit_code(report)}. PASS needs every primary criterion shown inside its bound; "
        "FAIL means one criterion (primary or guard) is shown outside; INCONCLUSIVE means an interval "
        "straddles a bound.",
        "",
    ]
    extras = [f"- {inline(x)}" for x in (S.teacher_line(report), S.sequential_line(report), S.capacity_line(report)) if x]
    lines += extras + ([""] if extras else [])
    sections = [
        _criteria_section(report, cap),
        _compared_section(report, cap),
        _metrics_section(report, cap),
        _speed_section(report),
        _warnings_section(report, cap),
        ["### Reproduce", "", code_block(str(report.get("command") or "(command not recorded)"))],
    ]
    for section in sections:
        if section:
            lines += section + [""]
    version = report.get("kvqual_version") or S.MISSING
    created = report.get("created_at") or S.MISSING
    lines.append(f"<sub>kvqual {inline(version)} · report schema {inline(report.get('schema_version'))}"
                 f" · created {inline(created)} · full plots and examples in report.html</sub>")
    return "\n".join(lines) + "\n"


def render_markdown(report: Mapping[str, Any], limit: int = GITHUB_COMMENT_LIMIT) -> str:
    """The report as GitHub Markdown, shortened (tables capped, then cut) to fit `limit` chars."""
    text = ""
    for cap in _ROW_CAPS:
        text = _render(report, cap)
        if len(text) <= limit:
            return text
    note = "\n\n_… report cut to fit the comment size limit; see report.html._\n"
    return text[: limit - len(note)] + note
