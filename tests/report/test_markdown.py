"""report.md: a PR comment that reads as a decision — verdict, why, what next, criteria, what was
compared and speed in ≤ 60 lines; the long parts folded in <details>; GitHub tables that parse;
words for status, never emoji; escaping and the comment size limit."""

from __future__ import annotations

import copy
import re
import unicodedata
from typing import Any

from markdown_it import MarkdownIt

from kvqual.report import decision as D
from kvqual.report import summary as S
from kvqual.report.markdown import GITHUB_COMMENT_LIMIT, cell, code_block, render_markdown

PR_COMMENT_LINES = 60


def _gfm_html(text: str) -> str:
    """GitHub-flavoured enough: CommonMark with raw HTML (for <details>) and GFM tables."""
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(text)


def outside_details(text: str) -> list[str]:
    """The lines a reader sees before unfolding anything: <summary> lines count, their bodies don't."""
    shown, depth = [], 0
    for line in text.splitlines():
        if line.startswith("</details>"):
            depth -= 1
            shown.append(line)
            continue
        if depth == 0:
            shown.append(line)
        if line.startswith("<details>"):
            depth += 1
    assert depth == 0, "unbalanced <details>"
    return shown


def large_report(report: dict[str, Any]) -> dict[str, Any]:
    """The sample grown to 14 suites (one accuracy criterion each), 3 sequential looks, KV capacity,
    6 warnings and --allow-mismatch: every optional line of the head at once."""
    big = copy.deepcopy(report)
    names = [f"suite-{i:02d}" for i in range(14)]
    arith, criteria = big["suites"]["arith"], big["verdict"]["criteria"]
    accuracy = next(c for c in criteria if c["name"] == "accuracy")
    big["suites"].update({n: copy.deepcopy(arith) for n in names})
    big["verdict"]["criteria"] = criteria + [dict(accuracy, suite=n, status="pass" if i % 3 else "inconclusive")
                                             for i, n in enumerate(names)]
    for arm in ("baseline", "candidate", "aa"):
        big["runs"][arm]["suites"] += [{"name": n, "sha256": "ab" * 32, "n_items": 50} for n in names]
    labels = [c.get("label") or c["name"] for c in big["verdict"]["criteria"]]
    big["verdict"]["sequential"] = {
        "planned_looks": 4, "pool": 800, "sizes": [200, 400, 600, 800], "nominal_alpha": 0.0193,
        "stop": "decided at look 3 of 4 (600 of 800 items)", "overlap": False,
        "looks": [{"look": k, "items": 200 * k, "verdict": "INCONCLUSIVE" if k < 3 else "FAIL",
                   "criteria": {label: {"estimate": 0.01, "ci_low": 0.0, "ci_high": 0.05, "status": "pass", "n": 200 * k}
                                for label in labels}} for k in (1, 2, 3)]}
    big["capacity"] = {"baseline": 116_000, "candidate": 376_000, "ratio": 3.24}
    big["warnings"] = [f"warning {i}: something the reader should know" for i in range(6)]
    big["allow_mismatch"] = True
    return big


def _criteria_lines(text: str) -> list[str]:
    section = text.split("### Criteria")[1].split("\n\n", 2)[1]
    return [line for line in section.splitlines() if line.startswith("| ")][1:]


def test_verdict_why_and_what_next_come_first(report):
    lines = render_markdown(report).splitlines()
    decision = D.decision(report)  # the two sentences report.html leads with too
    assert lines[0] == "## kvqual: **FAIL** — bf16 → fp8 (exit code 1)"
    assert lines[2] == f"- **Why:** {cell(decision.why)}"
    assert lines[3] == f"- **Next:** {cell(decision.next_step)}"
    assert "nats/token" in lines[2] and "bound ≤ 0.03 nats/token" in lines[2]
    assert lines[3].startswith("- **Next:** Do not ship fp8")
    assert "**Warning:** fp8 server reported kv_scale 1.0 for every layer" in "\n".join(lines[:10])


def test_criteria_table_has_one_row_per_criterion_in_the_shared_display_units(report):
    text = render_markdown(report)
    rows = _criteria_lines(text)
    expected = S.criterion_rows(report)
    assert len(rows) == len(expected) == 7
    for line, row in zip(rows, expected):
        assert line.startswith(f"| {cell(row.label)} | {row.suite} | {row.role} | {cell(row.estimate)} | "
                               f"{cell(row.ci)} | {cell(row.bound)} | "), line
    accuracy = rows[0].split(" | ")
    assert re.fullmatch(r"[−-]5\.00 (points|pts)", accuracy[3]), accuracy  # points, 3 significant figures
    assert re.fullmatch(r"\[[−-]16\.0, \+?6\.00\] \(90%\)", accuracy[4]), accuracy
    assert accuracy[6] == "**INCONCLUSIVE** (≈140 more items would decide)"
    statuses = [line.split(" | ")[6] for line in rows]
    assert statuses == ["**INCONCLUSIVE** (≈140 more items would decide)", "pass", "**FAIL**", "pass", "pass",
                        "pass", "not evaluated"]


def test_status_is_words_not_emoji(report, null_report):
    for r in (report, null_report, large_report(report)):
        text = render_markdown(r)
        emoji = {ch for ch in text if unicodedata.category(ch) == "So" and ord(ch) >= 0x2600 or ch == "\ufe0f"}
        assert not emoji, emoji


def test_fits_a_pr_comment_and_folds_the_long_parts(report):
    for r in (report, large_report(report)):
        text = render_markdown(r)
        shown = outside_details(text)
        assert len(shown) <= PR_COMMENT_LINES, len(shown)
        head = "\n".join(shown)
        for needle in ("**Why:**", "**Next:**", "### Criteria", "### What was compared, and speed",
                       "Throughput ratio (cand / base)"):
            assert needle in head, needle
        for folded in ("Metrics against the A/A noise floor", "Runs, suites and every speed figure", "Reproduce"):
            summary = next(line for line in shown if folded in line)
            assert summary.startswith("<details><summary>")
        assert "| overall | accuracy, baseline |" not in head  # the per-suite metrics are folded
        assert "| overall | accuracy, baseline |" in text


def test_the_large_report_shows_failing_and_open_criteria_first(report):
    big = large_report(report)
    text = render_markdown(big)
    rows = _criteria_lines(text)
    assert len(rows) == 12 < len(big["verdict"]["criteria"]) == 21
    statuses = [line.split(" | ")[6].split(" (")[0] for line in rows]
    assert statuses[0] == "**FAIL**" and statuses[1:6] == ["**INCONCLUSIVE**"] * 5 and "pass" in statuses[6:]
    assert "_9 more criteria in the full table below (failing and inconclusive ones are listed first)._ PASS" in text
    head = "\n".join(outside_details(text))
    assert "KV capacity: 116,000 tokens → 376,000 tokens" in head and "--allow-mismatch" in head
    assert "- 3 more warnings: see below." in head and "<details><summary>All 6 warnings</summary>" in text
    assert "and 10 more" in head  # suites named in one line, not one row each


def test_renders_as_github_markdown_tables(report):
    for r in (report, large_report(report)):
        text = render_markdown(r)
        html = _gfm_html(text)
        pipe_tables = len(re.findall(r"^\|---", text, flags=re.M))
        assert pipe_tables >= 6 and html.count("<table>") == pipe_tables  # every table parses as one
        assert html.count("<details>") == html.count("</details>") == text.count("<details>")
        assert "<p>|" not in html  # no table fell back to a paragraph of pipes
    html = _gfm_html(render_markdown(report))
    criteria_table = html.split("<table>")[1]
    assert criteria_table.count("<tr>") == 1 + 7  # header + one row per criterion
    assert "<td>mean KL beyond A/A floor</td>" in criteria_table and "<td>kl_excess" not in html
    folded = html.split("<summary>Metrics against the A/A noise floor")[1].split("</details>")[0]
    assert "<table>" in folded and "<td>same top-1 token</td>" in folded


def test_what_was_compared_and_speed(report):
    text = render_markdown(report)
    section = text.split("### What was compared, and speed")[1].split("<details>")[0]
    assert "| Baseline | bf16 | SmolLM2-135M-Instruct | bf16 | bf16 | not reported | 40 / 0 |" in section
    assert "| Candidate | fp8 | SmolLM2-135M-Instruct | fp8_e4m3 | fp8_e4m3 | 1.0 | 40 / 0 |" in section
    assert "| A/A replicate | bf16 |" in section
    assert "2 suites: arith (20 items), sampled (20 items)" in section
    assert "Throughput ratio (cand / base): **1.18×**, CI [1.09, 1.27], at concurrency 8." in section
    assert "| Target | bf16 | fp8 | bf16 |" in text  # the full run table, folded
    assert "| arith | 20 | 3f5a9c0e7b21 | 20 | 20 | 0 |" in text
    assert "```sh\nkvqual compare bf16 fp8 --limit 20\n```" in text


def test_a_slower_candidate_is_flagged_in_the_head(report):
    r = copy.deepcopy(report)
    r["speed"]["ratio"] = {"estimate": 0.59, "ci_low": 0.55, "ci_high": 0.63}
    head = render_markdown(r).split("### Criteria")[0]
    assert "- Speed: the candidate's throughput is 0.59× the baseline's (CI [0.55, 0.63])" in head
    r["speed"]["slower"] = "the candidate is slower: 0.59× the baseline's per-request output tok/s [0.55, 0.63]"
    head = render_markdown(r).split("### Criteria")[0]
    assert "- **Note:** The candidate is slower: 0.59× the baseline's per-request output tok/s [0.55, 0.63]" in head


def test_next_step_for_each_verdict(report):
    inconclusive = copy.deepcopy(report)
    inconclusive["verdict"].update(verdict="INCONCLUSIVE", exit_code=3)
    for c in inconclusive["verdict"]["criteria"]:
        if c["status"] == "fail":
            c["status"] = "pass"
    head = render_markdown(inconclusive).split("### Criteria")[0]
    assert "- **Why:** " in head and "is not decided" in head
    assert "- **Next:** Run about 140 more items" in head
    passing = copy.deepcopy(inconclusive)
    passing["verdict"].update(verdict="PASS", exit_code=0)
    for c in passing["verdict"]["criteria"]:
        c["status"] = "pass" if c["status"] == "inconclusive" else c["status"]
    head = render_markdown(passing).split("### Criteria")[0]
    # as many as the criteria section lists as primary: the failed-request rates are run health (issue 53)
    assert ("- **Why:** All 4 primary criteria are shown inside their bounds; both failed-request rates are "
            "within theirs.") in head
    assert "- **Next:** fp8 can ship on these criteria." in head


def test_nulls_and_empty_lists_render_not_measured(null_report):
    text = render_markdown(null_report)
    assert text.startswith("## kvqual: **INCONCLUSIVE** — baseline → candidate (exit code 3)")
    assert "- **Why:** " in text and "- **Next:** " in text
    assert "| Target | — | — | not measured |" in text
    assert "- Speed: not measured." in text
    assert "_No suite information recorded._" in text and "No suite information recorded;" in text
    assert "(command not recorded)" in text
    assert "| accuracy difference (cand − base) | overall | primary | — | — | — | not evaluated | 0 items |" in text


def test_stays_under_github_comment_limit_with_a_note(report):
    big = copy.deepcopy(report)
    crit = big["verdict"]["criteria"]
    big["verdict"]["criteria"] = [dict(crit[i % len(crit)], suite=f"suite-{i}") for i in range(3000)]
    big["warnings"] = [f"warning {i}: " + "x" * 200 for i in range(500)]
    text = render_markdown(big)
    assert len(text) <= GITHUB_COMMENT_LIMIT
    assert "more criteria not shown (size limit)" in text
    assert "more warnings not shown" in text
    assert len(outside_details(text)) <= PR_COMMENT_LINES
    rows = _criteria_lines(text)  # failing first: 429 of 3000 fail here
    assert len(rows) == 12 and all("**FAIL**" in r for r in rows)
    assert text.splitlines()[0].startswith("## kvqual: **FAIL**")


def test_hard_cut_when_even_small_tables_do_not_fit(report):
    huge = dict(report, command="kvqual compare " + "a" * 100_000)
    text = render_markdown(huge)
    assert len(text) <= GITHUB_COMMENT_LIMIT
    assert text.rstrip().endswith("_… report cut to fit the comment size limit; see report.html._")
    assert text.count("<details>") == text.count("</details>")  # the cut closes the block it fell in


def test_cells_escape_pipes_html_and_newlines():
    assert cell("a|b<script>\nc") == "a\\|b&lt;script&gt; c"
    assert code_block("echo ```x```") == "````sh\necho ```x```\n````"


def test_hostile_target_name_is_neutralised(report):
    r = copy.deepcopy(report)
    r["runs"]["candidate"]["target"] = "<img src=x onerror=alert(1)>|fp8"
    r["warnings"] = ["<script>alert(2)</script>"]
    html = _gfm_html(render_markdown(r))
    assert "<img src=x" not in html and "<script>" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_kv_scale_forms():
    from kvqual.report.fmt import fmt_scale
    assert fmt_scale(1.0) == "1.0"
    assert fmt_scale(0.0213) == "0.0213"
    assert fmt_scale([1.0, 1.0, 1.0]) == "3 values, 1"
    assert fmt_scale({"layer.0": 0.5, "layer.1": 2.0}) == "2 values, 0.5–2"
    assert fmt_scale([]) == "—"


def test_epoch_timestamps_render_as_utc_iso(report):
    from kvqual.report.fmt import fmt_time
    assert fmt_time(1_796_079_600.4) == "2026-11-30T23:00:00Z"
    assert fmt_time("2026-11-30T22:40:00Z") == "2026-11-30T22:40:00Z"
    assert fmt_time(None) == "—"
    r = copy.deepcopy(report)
    r["runs"]["baseline"]["started_at"] = 1_796_079_600
    assert "| Started | 2026-11-30T23:00:00Z | 2026-11-30T22:40:00Z |" in render_markdown(r)


def test_an_unbounded_side_reads_as_infinity() -> None:
    from kvqual.report.fmt import fmt_interval

    assert fmt_interval([0.013, None]) == "[0.013, ∞)"
    assert fmt_interval([None, 2.5]) == "(−∞, 2.5]"
    assert fmt_interval([None, None]) == "—"
