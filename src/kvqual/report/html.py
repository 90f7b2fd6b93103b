"""report.html: one self-contained page (inline CSS, PNG data URIs, no script, no URLs).

It leads with the decision: the verdict as a badge (inline SVG shapes, no emoji font
needed), why and what next in one sentence each, then the forest plot of every criterion
against its bound beside the sequential trajectory. Below come report.md's tables (each
scrolling inside its own box), the plots and the most divergent samples side by side.
Model text is untrusted (it can hold HTML or <script>): Jinja2 autoescaping is on for the
whole template, and no value is ever marked safe except the plots' own data URIs.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

import jinja2

from kvqual.report import decision as D
from kvqual.report import fmt as F
from kvqual.report import summary as S
from kvqual.report.markdown import render_markdown
from kvqual.report.forest import forest_rows
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
            suite=str(ex.get("suite") or F.MISSING), id=str(ex.get("id") or F.MISSING),
            repeat=F.fmt_num(ex.get("repeat")), first_divergence=F.fmt_num(ex.get("first_divergence")),
            score_base=F.fmt_num(ex.get("score_base")), score_cand=F.fmt_num(ex.get("score_cand")),
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


STATUS_WORD = {"pass": "pass", "fail": "fail", "inconclusive": "inconclusive", "not_evaluated": "not judged"}
PLOTS = (  # name, caption, full width
    ("lengths", "Output lengths: paired per item, with the length criterion's bound", False),
    ("length_drift", "Length drift: candidate − baseline per item, in tokens", False),
    ("length_distribution", "Output length distributions of baseline, candidate and the A/A replicate (ECDF)", False),
    ("by_position", "KL and top-1 agreement by token position (buckets holding tokens)", False),
    ("first_divergence", "Where outputs first differ", False),
    ("flips", "Answer flips per suite", False),
    ("speed", "Speed per arm and the ratio", False),
)


def position_rows(report: Mapping[str, Any]) -> list[dict[str, str]]:
    """The teacher-forced token metrics per position bucket (report.json plots.by_position): A/B
    beside the A/A floor, every bucket listed, so a run whose outputs never reach 256 or 1,024
    tokens says so (0 tokens) rather than leaving the long buckets out."""
    block = F.get(report, "plots", "by_position") or {}
    ab = [b for b in block.get("ab") or [] if isinstance(b, Mapping)]
    aa = {(b.get("start"), b.get("end")): b for b in block.get("aa") or [] if isinstance(b, Mapping)}
    rows = []
    for b in ab:
        start, end = b.get("start"), b.get("end")
        f = aa.get((start, end)) or {}
        label = f"{F.fmt_num(start)}–{F.fmt_num(end - 1)}" if isinstance(end, int) else f"{F.fmt_num(start)}+"
        rows.append({"bucket": label, "tokens": F.fmt_num(b.get("n_tokens")),
                     "kl_ab": F.fmt_quantity(b.get("mean_kl"), "nats"), "kl_aa": F.fmt_quantity(f.get("mean_kl"), "nats"),
                     "top1_ab": F.fmt_pct(b.get("same_top1_rate")), "top1_aa": F.fmt_pct(f.get("same_top1_rate")),
                     "aa_tokens": F.fmt_num(f.get("n_tokens"))})
    return rows


def ci_text(report: Mapping[str, Any]) -> str:
    """'96% interval' for the forest legend: the level the criteria's intervals share."""
    levels = sorted({round(float(c["ci_level"]), 4) for c in F.get(report, "verdict", "criteria") or []
                     if isinstance(c, Mapping) and isinstance(c.get("ci_level"), (int, float))})
    return "interval" if not levels else " / ".join(f"{v:.0%}" for v in levels) + " interval"


def speed_fact(report: Mapping[str, Any]) -> tuple[str, bool] | None:
    """('candidate slower: 0.810× [0.725, 0.905] the baseline's …', True) or None. A candidate shown
    slower (report.json's speed.slower; in older reports, the ratio's whole interval below 1) is
    flagged beside the verdict though speed counts in it only with min_speedup; otherwise a note."""
    speed = report.get("speed") or {}
    ratio = F.get(speed, "ratio", "estimate")
    if not isinstance(ratio, (int, float)) or speed.get("apart_s") is not None:  # arms measured apart: no ratio
        return None
    high = F.get(speed, "ratio", "ci_high")
    slower = S.shown_slower(report)
    ci = F.fmt_quantity_interval(F.get(speed, "ratio", "ci_low"), high, "ratio")
    caveat = "" if speed.get("comparable") is not False else " (indicative only)"
    word = "slower" if slower else ("faster" if ratio >= 1 else "not shown slower")
    text = f"candidate {word}: {F.fmt_quantity(ratio, 'ratio')}{'' if ci == F.MISSING else ' ' + ci} the baseline's "
    return text + f"tokens/s per request{caveat}", slower


def render_html(report: Mapping[str, Any]) -> str:
    """The full report.html text for a report dict."""
    verdict, _ = S.verdict_line(report)
    tf = report.get("teacher_forcing") or {}
    speed, slower = speed_fact(report) or (None, False)
    stop = F.get(report, "verdict", "sequential", "stop")
    reason = F.get(report, "verdict", "reason")
    return _ENV.get_template("report.html.j2").render(
        title=S.title(report), verdict=verdict, decision=D.decision(report),
        exit_code=S.exit_code(report), facts=[str(stop)] if stop else [],
        speed_flag=speed if slower else None,
        forest=forest_rows(report), ci_text=ci_text(report), status_word=STATUS_WORD,
        kl_note="over the servers' top-k logprobs plus one tail bucket, an approximation that under-reports",
        criteria=S.criterion_rows(report), arms=S.arm_rows(report), suites=S.suite_rows(report),
        tail=S.tail_rows(report), tail_header=S.TAIL_HEADER,
        notes=[x for x in (f"gate: {reason}" if reason else None, S.teacher_line(report), S.tail_line(report),
                           S.fit_line(report), S.sequential_line(report), S.bounds_line(report),
                           S.capacity_line(report), None if slower else speed) if x],
        trajectory=S.trajectory_rows(report),
        trajectory_plot=to_data_uri(trajectory_figure(report.get("verdict"))),
        metrics=S.metric_rows(report), speed=S.speed_rows(report),
        speed_note=F.get(report, "speed", "note"), speed_apart=F.get(report, "speed", "apart_s") is not None,
        plots=all_plots(report), plot_list=PLOTS, positions=position_rows(report), examples=example_views(report),
        n_examples=len(report.get("examples") or []),
        warnings=[str(w) for w in report.get("warnings") or []],
        teacher_forcing={"enabled": tf.get("enabled"), "note": tf.get("note")}, allow_mismatch=bool(report.get("allow_mismatch")),
        command=str(report.get("command") or "(command not recorded)"),
        kvqual_version=str(report.get("kvqual_version") or F.MISSING),
        created_at=str(report.get("created_at") or F.MISSING),
        markdown=render_markdown(report),
    )
