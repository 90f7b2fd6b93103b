"""report.md: the verdict and its evidence as GitHub Markdown, ready to paste as a PR comment.

The first screen answers a reviewer in at most ~60 lines for a realistic report: the verdict,
one sentence of why and one of what to do next (decision.decision, the two report.html leads
with), the criteria table, what was compared and the speed. Everything long (per-criterion
notes, sequential looks, the full run, suite and speed tables, per-suite metrics, the command)
sits in `<details>` blocks, which GitHub folds; a blank line after each `<summary>` lets it
render the Markdown inside. Numbers come from summary.py, as every format shows them: accuracy
and rate differences in points, KL in nats per token, ratios as ×, three significant figures.
Status is a word, never an emoji (no emoji font needed). Long tables are cut so the text stays
under GitHub's comment limit (65,536 characters), with a note.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvqual.report import decision as D
from kvqual.report import fmt as F
from kvqual.report import summary as S

GITHUB_COMMENT_LIMIT = 65_536
CRITERIA_SHOWN = 12  # criteria rows outside <details>; the rest are in the full table below it
WARNINGS_SHOWN = 3  # warnings in the head; all of them in a folded block when there are more
_ROW_CAPS: tuple[int | None, ...] = (None, 200, 100, 50, 20, 8, 3)
_STATUS_ORDER = {"fail": 0, "inconclusive": 1, "pass": 2, "not_evaluated": 3}
_STATUS_WORD = {"fail": "**FAIL**", "inconclusive": "**INCONCLUSIVE**", "pass": "pass",
                "not_evaluated": "not evaluated"}

UNITS_NOTE = ("Accuracy and rate differences in percentage points, failed requests in %, ratios (cand / base) "
              "as ×, KL(base‖cand) in nats per token over the top-k logprobs (the criterion averages items; the "
              "metrics' token mean pools tokens).")


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


def details(summary: str, body: list[str]) -> list[str]:
    """A folded block; the blank line after <summary> makes GitHub render the Markdown in it."""
    return [f"<details><summary>{inline(summary)}</summary>", ""] + body + ["", "</details>"]


def _status(row: S.CriterionRow) -> str:
    word = _STATUS_WORD.get(row.status, row.status)
    if row.holm:
        word += f" ({row.holm})"
    elif row.status == "inconclusive" and row.n_more != F.MISSING:
        word += f" (≈{row.n_more} more {row.unit} would decide)"
    return word


def _what(row: S.CriterionRow) -> str:
    return row.label if row.suite == "overall" else f"{row.label} ({row.suite})"


def _speed_bullet(report: Mapping[str, Any]) -> str | None:
    """The speed ratio in one line; the compare's own flag (`speed.slower`, set when the whole
    interval is below 1) in bold when the candidate is shown slower."""
    slower = F.get(report, "speed", "slower")
    if slower:
        return f"**Note:** {inline(slower[:1].upper() + slower[1:])}"
    if F.get(report, "speed", "apart_s") is not None:  # two moments: no ratio between them
        return f"Speed: {inline(str(F.get(report, 'speed', 'note')))}"
    ratio = F.get(report, "speed", "ratio") or {}
    est = ratio.get("estimate")
    if not isinstance(est, (int, float)) or isinstance(est, bool):
        return None
    return f"Speed: the candidate's throughput is {F.fmt_num(float(est))}× the baseline's (CI {_ratio_ci(ratio)})"


def _ratio_ci(ratio: Mapping[str, Any]) -> str:
    lo, hi = ratio.get("ci_low"), ratio.get("ci_high")
    return F.MISSING if lo is None or hi is None else f"[{F.fmt_num(lo)}, {F.fmt_num(hi)}]"


def _head(report: Mapping[str, Any]) -> list[str]:
    verdict, _ = S.verdict_line(report)
    decision = D.decision(report)  # the same two sentences report.html leads with
    lines = [f"## kvqual: **{verdict}** — {inline(S.title(report))} (exit code {S.exit_code(report)})", "",
             f"- **Why:** {inline(decision.why)}",
             f"- **Next:** {inline(decision.next_step)}"]
    extras = (S.teacher_line(report), S.tail_line(report), S.fit_line(report), S.sequential_line(report),
              S.bounds_line(report),
              S.capacity_line(report))
    lines += [f"- {inline(x)}" for x in extras if x]
    speed = _speed_bullet(report)
    if speed:
        lines.append(f"- {speed}")
    if report.get("allow_mismatch"):
        lines.append("- **`--allow-mismatch` was set:** the arms may not run the configured models/dtypes.")
    warnings = [str(w) for w in report.get("warnings") or []]
    lines += [f"- **Warning:** {inline(w)}" for w in warnings[:WARNINGS_SHOWN]]
    if len(warnings) > WARNINGS_SHOWN:
        lines.append(f"- {len(warnings) - WARNINGS_SHOWN} more warnings: see below.")
    return lines


def _criteria_rows(rows: list[S.CriterionRow]) -> list[list[str]]:
    return [[r.label, r.suite, r.role, r.estimate, r.ci, r.bound, _status(r), f"{r.n} {r.unit}"] for r in rows]


_CRITERIA_HEADER = ["Criterion", "Suite", "Role", "Estimate", "CI", "Bound", "Status", "n"]


def _criteria_section(report: Mapping[str, Any], cap: int | None) -> list[str]:
    rows = S.criterion_rows(report)
    if not rows:
        return ["### Criteria", "", "_No criteria were evaluated._"]
    shown = rows
    if len(rows) > CRITERIA_SHOWN:
        shown = sorted(rows, key=lambda r: _STATUS_ORDER.get(r.status, 4))[:CRITERIA_SHOWN]
    out = ["### Criteria", ""] + table(_CRITERIA_HEADER, _criteria_rows(shown))
    more = ""
    if len(shown) < len(rows):
        n = len(rows) - len(shown)
        more = (f"_{n} more criteri{'on' if n == 1 else 'a'} in the full table below (failing and inconclusive "
                "ones are listed first)._ ")
    out += ["", more + "PASS needs every primary criterion shown inside its bound; FAIL means one criterion "
                "(primary or guard) is shown outside; INCONCLUSIVE means an interval straddles a bound. "
                + UNITS_NOTE, ""]
    full, note = _capped(rows, cap, "criteria")
    body = [f"Gate: {inline(S.verdict_line(report)[1])}", ""]
    if len(shown) < len(rows):
        body += table(_CRITERIA_HEADER, _criteria_rows(full)) + note + [""]
    body += table(["Criterion", "Status", "Detail"], ([_what(r), _status(r), r.detail] for r in full)) + note
    title = f"All {len(rows)} criteria, with the gate's notes"
    header, looks = S.trajectory_rows(report)
    if looks:
        title += f" and the {len(looks)} sequential look{'s' if len(looks) != 1 else ''}"
        body += ["", "**Sequential looks** (each primary criterion's interval as items accumulate):", "",
                 *table(header, looks)]
    return out + details(title, body)


def _capped(rows: list[Any], cap: int | None, what: str) -> tuple[list[Any], list[str]]:
    if cap is None or len(rows) <= cap:
        return rows, []
    note = f"_… {len(rows) - cap} more {what} not shown (size limit); see report.html or report.json._"
    return rows[:cap], ["", note]


_COMPACT_ARM = ("Target", "Model", "KV cache dtype (configured)", "KV cache dtype (server-reported)",
                "KV scale (server-reported)")


def _compared_section(report: Mapping[str, Any]) -> list[str]:
    """One row per arm: what ran, how many requests failed, and how fast it answered."""
    arms = {r.label: r for r in S.arm_rows(report)}
    speed = report.get("speed") or {}
    ok, failed = arms.get("Requests ok"), arms.get("Requests failed")
    rows = []
    for name, attr in (("Baseline", "baseline"), ("Candidate", "candidate"), ("A/A replicate", "aa")):
        values = [getattr(arms[label], attr) for label in _COMPACT_ARM if label in arms]
        if attr == "aa" and all(v == F.NOT_MEASURED for v in values):
            continue
        req = f"{getattr(ok, attr)} / {getattr(failed, attr)}" if ok and failed else F.MISSING
        rows.append([name, *values, req, F.fmt_num(F.get(speed, attr, "output_tok_s")),
                     F.fmt_num(F.get(speed, attr, "latency_p50"))])
    out = ["### What was compared, and speed", ""]
    out += table(["", "Target", "Model", "KV dtype (configured)", "KV dtype (server)", "KV scale",
                  "Requests ok / failed", "Output tok/s", "Latency p50 (s)"], rows)
    suites = S.suite_rows(report)
    tf = report.get("teacher_forcing") or {}
    enabled = tf.get("enabled")
    tf_text = "on" if enabled else ("off" if enabled is False else F.NOT_MEASURED)
    if tf.get("note"):
        tf_text += f" ({tf['note']})"
    if suites:
        names = ", ".join(f"{s.name} ({s.n_items} items)" for s in suites[:6])
        names += f" and {len(suites) - 6} more" if len(suites) > 6 else ""
        about = f"{len(suites)} suite{'s' if len(suites) != 1 else ''}: {names}"
    else:
        about = "No suite information recorded"
    out += ["", f"- {inline(about)}; pairs are matched by suite, item id and repeat; teacher-forced token "
                f"metrics: {inline(tf_text)}."]
    if not speed:
        out.append("- Speed: not measured.")
    elif speed.get("apart_s") is not None:  # arms measured at different times: no ratio
        out.append(f"- Throughput ratio: none; {inline(str(speed.get('note')))}.")
    else:
        ratio = speed.get("ratio") or {}
        line = (f"- Throughput ratio (cand / base): **{F.fmt_num(ratio.get('estimate'))}×**, CI {_ratio_ci(ratio)}, "
                f"at concurrency {F.fmt_num(F.get(speed, 'candidate', 'concurrency'))}")
        out.append(line + (f"; {inline(speed['note'])}." if speed.get("note") else "."))
    return out


def _folded_tail(report: Mapping[str, Any], cap: int | None) -> list[str]:
    """The long parts, folded one after the other: runs, suites and speed; metrics; warnings; the command."""
    suites, note = _capped(S.suite_rows(report), cap, "suites")
    body = table(["", "Baseline", "Candidate", "A/A replicate (baseline again)"],
                 ([r.label, r.baseline, r.candidate, r.aa] for r in S.arm_rows(report)))
    body += [""] + (table(["Suite", "Items", "sha256", "A/B pairs", "A/A floor pairs", "Dropped pairs"],
                          ([s.name, s.n_items, s.sha256, s.ab_pairs, s.aa_pairs, s.dropped_pairs]
                           for s in suites)) + note if suites else ["_No suite information recorded._"])
    speed = S.speed_rows(report)[:-1]
    if speed:
        body += ["", *table(["Speed", "Baseline", "Candidate"], ([r.label, r.baseline, r.candidate] for r in speed))]
    out = details("Runs, suites and every speed figure" if speed else "Runs and suites in full", body)
    rows, note = _capped(S.metric_rows(report), cap, "metric rows")
    if rows:
        n = len({r.suite for r in rows})
        out += details(f"Metrics against the A/A noise floor ({n} suite{'s' if n != 1 else ''}, {len(rows)} rows)",
                       table(["Suite", "Metric", "A/B (base vs cand)", "A/A floor (base vs base)"],
                             ([r.suite, r.metric, r.ab, r.aa] for r in rows)) + note)
    warnings = [str(w) for w in report.get("warnings") or []]
    if len(warnings) > WARNINGS_SHOWN:
        shown, note = _capped(warnings, cap, "warnings")
        out += details(f"All {len(warnings)} warnings", [f"- {inline(w)}" for w in shown] + note)
    return out + details("Reproduce", [code_block(str(report.get("command") or "(command not recorded)"))])


def _worst_section(report: Mapping[str, Any], cap: int | None) -> list[str]:
    """The worst prompts by KL and the candidate's answers that were not data: which prompts broke."""
    rows = S.tail_rows(report)
    if not rows:
        return []
    shown = rows if cap is None else rows[:max(cap, 3)]
    return details(f"The tail: the worst prompts ({len(rows)} listed)",
                   table(S.TAIL_HEADER, [[inline(c) for c in r] for r in shown]))


def _render(report: Mapping[str, Any], cap: int | None) -> str:
    lines: list[str] = []
    for section in (_head(report), _criteria_section(report, cap), _worst_section(report, cap),
                    _compared_section(report), _folded_tail(report, cap)):
        lines += section + [""]
    version = report.get("kvqual_version") or F.MISSING
    created = report.get("created_at") or F.MISSING
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
    closing = "\n\n</details>"
    text = text[: limit - len(note) - len(closing)]
    if text.count("<details>") > text.count("</details>"):
        text += closing  # the cut fell inside a folded block: close it, so the note shows
    return text + note
