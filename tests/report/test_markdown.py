"""report.md: verdict first, the criteria table, what was compared, size limit, escaping."""

from __future__ import annotations

import copy

from markdown_it import MarkdownIt

from kvqual.report.markdown import GITHUB_COMMENT_LIMIT, cell, code_block, render_markdown


def _gfm_html(text: str) -> str:
    return MarkdownIt("commonmark", {"html": True}).enable("table").render(text)


def test_verdict_and_reason_come_first(report):
    lines = render_markdown(report).splitlines()
    assert lines[0] == "## ❌ kvqual: **FAIL** — fp8 vs bf16"
    assert lines[2].startswith("**kl_excess (overall): mean KL beyond the A/A floor 0.041 &gt; 0.03")
    assert "Exit code 1." in lines[4]


def test_criteria_table_has_one_row_per_criterion_with_estimate_ci_bound_status(report):
    text = render_markdown(report)
    assert "| mean KL beyond A/A floor | overall | primary | 0.041 | [0.034, 0.049] (90%) | ≤ 0.03 | ❌ fail | 40 items |" in text
    assert "| accuracy difference (cand − base) | arith | primary | -0.05 | [-0.16, 0.06] (90%) | ≥ -0.05 | ⚠️ inconclusive (≈140 more items would decide) |" in text
    assert "| within [0.9, 1.1] | ✅ pass |" in text
    assert "| throughput ratio (cand / base) | overall | primary | — | — | — | ➖ not_evaluated |" in text
    section = text.split("### Criteria")[1].split("###")[0]
    rows = [l for l in section.splitlines() if l.startswith("| ") and "Criterion" not in l]
    assert len(rows) == len(report["verdict"]["criteria"]) == 7


def test_what_was_compared_names_targets_models_dtypes_scales_suites_and_floor(report):
    text = render_markdown(report)
    assert "| Target | bf16 | fp8 | bf16 |" in text
    assert "| Model | SmolLM2-135M-Instruct | SmolLM2-135M-Instruct | SmolLM2-135M-Instruct |" in text
    assert "| KV cache dtype (configured) | bf16 | fp8_e4m3 | bf16 |" in text
    assert "| KV cache dtype (server-reported) | bf16 | fp8_e4m3 | bf16 |" in text
    assert "| KV scale (server-reported) | not reported | 1.0 | not reported |" in text
    assert "| arith | 20 | 3f5a9c0e7b21 | 20 | 20 | 0 |" in text
    assert "| overall | same top-1 token | 92.6% | 98.9% |" in text
    assert "Throughput ratio (cand / base): **1.181**, CI [1.09, 1.27]" in text
    assert "```sh\nkvqual compare bf16 fp8 --limit 20\n```" in text
    assert "fp8 server reported kv_scale 1.0 for every layer" in text


def test_renders_as_github_markdown_tables(report):
    html = _gfm_html(render_markdown(report))
    assert html.count("<table>") == 5  # criteria, arms, suites, metrics, speed
    criteria_table = html.split("<table>")[1]
    assert criteria_table.count("<tr>") == 1 + 7  # header + one row per criterion
    assert "<td>≤ 0.03</td>" in criteria_table
    assert "<td>kl_excess" not in html and "<td>mean KL beyond A/A floor</td>" in html


def test_nulls_and_empty_lists_render_not_measured(null_report):
    text = render_markdown(null_report)
    assert text.startswith("## ⚠️ kvqual: **INCONCLUSIVE** — candidate vs baseline")
    assert "**no reason given**" in text
    assert "| Target | — | — | not measured |" in text
    assert "### Throughput\n\n_Not measured._" in text
    assert "_No suite information recorded._" in text
    assert "(command not recorded)" in text
    assert "| accuracy difference (cand − base) | overall | primary | — | — | — | ➖ not_evaluated | 0 items |  |" in text


def test_stays_under_github_comment_limit_with_a_note(report):
    big = copy.deepcopy(report)
    crit = big["verdict"]["criteria"]
    big["verdict"]["criteria"] = [dict(crit[i % len(crit)], suite=f"suite-{i}") for i in range(3000)]
    big["warnings"] = [f"warning {i}: " + "x" * 200 for i in range(500)]
    text = render_markdown(big)
    assert len(text) <= GITHUB_COMMENT_LIMIT
    assert "more criteria (failing and inconclusive listed first) not shown" in text
    assert "more warnings not shown" in text
    # failing criteria are listed first, so the cut keeps them (429 of 3000 fail here)
    section = text.split("### Criteria")[1].split("###")[0]
    rows = [l for l in section.splitlines() if l.startswith("| ") and "Criterion" not in l]
    assert rows and all("❌ fail" in r for r in rows)
    assert text.splitlines()[0].startswith("## ❌ kvqual: **FAIL**")


def test_hard_cut_when_even_small_tables_do_not_fit(report):
    huge = dict(report, command="kvqual compare " + "a" * 100_000)
    text = render_markdown(huge)
    assert len(text) <= GITHUB_COMMENT_LIMIT
    assert text.rstrip().endswith("_… report cut to fit the comment size limit; see report.html._")


def test_cells_escape_pipes_html_and_newlines():
    assert cell("a|b<script>\nc") == "a\\|b&lt;script&gt; c"
    assert code_block("echo ```x```") == "````sh\necho ```x```\n````"


def test_hostile_target_name_is_neutralised(report):
    r = copy.deepcopy(report)
    r["runs"]["candidate"]["target"] = "<img src=x onerror=alert(1)>|fp8"
    html = _gfm_html(render_markdown(r))
    assert "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_kv_scale_forms():
    from kvqual.report.summary import fmt_scale
    assert fmt_scale(1.0) == "1.0"
    assert fmt_scale(0.0213) == "0.0213"
    assert fmt_scale([1.0, 1.0, 1.0]) == "3 values, 1"
    assert fmt_scale({"layer.0": 0.5, "layer.1": 2.0}) == "2 values, 0.5–2"
    assert fmt_scale([]) == "—"


def test_epoch_timestamps_render_as_utc_iso(report):
    from kvqual.report.summary import fmt_time
    assert fmt_time(1_796_079_600.4) == "2026-11-30T23:00:00Z"
    assert fmt_time("2026-11-30T22:40:00Z") == "2026-11-30T22:40:00Z"
    assert fmt_time(None) == "—"
    r = copy.deepcopy(report)
    r["runs"]["baseline"]["started_at"] = 1_796_079_600
    assert "| Started | 2026-11-30T23:00:00Z | 2026-11-30T22:40:00Z |" in render_markdown(r)


def test_an_unbounded_side_reads_as_infinity() -> None:
    from kvqual.report.summary import fmt_interval

    assert fmt_interval([0.013, None]) == "[0.013, ∞)"
    assert fmt_interval([None, 2.5]) == "(−∞, 2.5]"
    assert fmt_interval([None, None]) == "—"
