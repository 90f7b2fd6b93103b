"""report.html: one self-contained page (inline CSS, PNG data URIs, no script, no URLs).

It repeats report.md's content and adds the plots and the most divergent samples side by
side. Model text is untrusted (it can hold HTML or <script>): Jinja2 autoescaping is on for
the whole template, and no value is ever marked safe except the plots' own data URIs.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

import jinja2

from kvqual.report import summary as S
from kvqual.report.markdown import render_markdown
from kvqual.report.plots import all_plots, to_data_uri, trajectory_figure

MAX_EXAMPLES = 12
MARK_MAX_CHARS = 40


@dataclass(frozen=True)
class TextSplit:
    """An output cut at the divergence point: common prefix, the marked span, the rest."""

    before: str
    marked: str
    after: str
    ends_here: bool


@dataclass(frozen=True)
class ExampleView:
    """One divergent sample pair ready for the template."""

    suite: str
    id: str
    repeat: str
    first_divergence: str
    score_base: str
    score_cand: str
    base: TextSplit
    cand: TextSplit


def split_at(text: str, at: int | None) -> TextSplit:
    """Cut text at char offset `at`, marking from there to the end of that word (≤ 40 chars)."""
    if at is None or at < 0:
        return TextSplit(text, "", "", False)
    at = min(at, len(text))
    end = at
    while end < len(text) and end - at < MARK_MAX_CHARS and (end == at or not text[end].isspace()):
        end += 1
    return TextSplit(text[:at], text[at:end], text[end:], at >= len(text))


def example_views(report: Mapping[str, Any], limit: int = MAX_EXAMPLES) -> list[ExampleView]:
    """The `limit` most divergent examples: earliest first divergence first, identical last."""
    def key(ex: Mapping[str, Any]) -> tuple[int, float, str, str, int]:
        fd = ex.get("first_divergence")
        dc = ex.get("divergence_char")
        identical = fd is None and dc is None
        order = fd if fd is not None else (dc if dc is not None else 0)
        return (int(identical), float(order), str(ex.get("suite")), str(ex.get("id")),
                int(ex.get("repeat") or 0))

    views = []
    for ex in sorted(report.get("examples") or [], key=key)[:limit]:
        at = ex.get("divergence_char")
        views.append(ExampleView(
            suite=str(ex.get("suite") or S.MISSING), id=str(ex.get("id") or S.MISSING),
            repeat=S.fmt_num(ex.get("repeat")), first_divergence=S.fmt_num(ex.get("first_divergence")),
            score_base=S.fmt_num(ex.get("score_base")), score_cand=S.fmt_num(ex.get("score_cand")),
            base=split_at(str(ex.get("base_text") or ""), at),
            cand=split_at(str(ex.get("cand_text") or ""), at),
        ))
    return views


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("kvqual.report", "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
)


def render_html(report: Mapping[str, Any]) -> str:
    """The full report.html text for a report dict."""
    verdict, icon, reason = S.verdict_line(report)
    tf = report.get("teacher_forcing") or {}
    return _ENV.get_template("report.html.j2").render(
        title=S.title(report), verdict=verdict, icon=icon, reason=reason,
        exit_code=S.exit_code(report),
        criteria=S.criterion_rows(report), arms=S.arm_rows(report), suites=S.suite_rows(report),
        notes=[x for x in (S.teacher_line(report), S.sequential_line(report), S.capacity_line(report)) if x],
        trajectory=S.trajectory_rows(report),
        trajectory_plot=to_data_uri(trajectory_figure(report.get("verdict"))),
        metrics=S.metric_rows(report), speed=S.speed_rows(report),
        plots=all_plots(report), examples=example_views(report),
        n_examples=len(report.get("examples") or []),
        warnings=[str(w) for w in report.get("warnings") or []],
        teacher_forcing={"enabled": tf.get("enabled"), "note": tf.get("note")}, allow_mismatch=bool(report.get("allow_mismatch")),
        command=str(report.get("command") or "(command not recorded)"),
        kvqual_version=str(report.get("kvqual_version") or S.MISSING),
        created_at=str(report.get("created_at") or S.MISSING),
        markdown=render_markdown(report),
    )
