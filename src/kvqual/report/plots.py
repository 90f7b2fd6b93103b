"""The matplotlib figures of report.html (the forest plot of the decision is forest.py's).

Each `*_figure` function draws one block of
report["plots"] and returns None when there is nothing to draw; `all_plots` turns them into
base64 PNG data URIs so the file opens offline. Figures use matplotlib's object API (no
pyplot state) and PNGs carry no metadata, so the same input gives the same bytes.
Baseline is blue, candidate orange, the A/A floor (baseline vs baseline) grey dashes, a
criterion's bound red dashes; no two translucent fills ever overlap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from kvqual.report import decision as D
from kvqual.report import fmt as F

# the length figures, and the palette and PNG encoding every figure shares: their own modules, their names
# here too
from kvqual.report.lengthplots import (  # noqa: F401
    length_distribution_figure, length_drift_figure, lengths_figure)
from kvqual.report.plotstyle import (  # noqa: F401
    BASE, BOUND, BOUND_STYLE, CAND, DPI, FLOOR, FLOOR_STYLE, PASS_ZONE, STATUS_COLOR, _ints, to_data_uri)


# ---------------------------------------------------------------- figures


def _criterion(report: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    for c in F.get(report, "verdict", "criteria") or []:
        if isinstance(c, Mapping) and c.get("name") == name:
            return c
    return {}


def _divergence_cdf(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, int]:
    """Sorted divergence positions and the share of *all* pairs diverged by each one."""
    total = len(values)
    diverged = np.sort(np.array(_ints([v for v in values if v is not None]), dtype=float))
    share = np.arange(1, len(diverged) + 1) / total if total else np.array([])
    return diverged, share, total


def first_divergence_figure(block: Mapping[str, Any] | None) -> Figure | None:
    """CDF of the first token where the two outputs differ (identical pairs never count)."""
    ab = list((block or {}).get("ab") or [])
    aa = list((block or {}).get("aa") or [])
    if not ab:
        return None
    fig = Figure(figsize=(6.4, 3.4))
    ax = fig.add_subplot()
    for values, label, style in ((ab, "A/B (base vs cand)", {"color": CAND, "linewidth": 2}),
                                 (aa, "A/A floor (base vs base)", FLOOR_STYLE)):
        if not values:
            continue
        x, y, total = _divergence_cdf(values)
        identical = total - len(x)
        if len(x):
            ax.step(np.concatenate([[0.0], x]), np.concatenate([[0.0], y]), where="post",
                    label=f"{label}: {identical}/{total} identical", **style)
        else:
            ax.axhline(0.0, label=f"{label}: all {total} identical", **style)
    ax.set_ylim(0, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("token position of first divergence")
    ax.set_ylabel("pairs diverged by then")
    ax.set_title("First-divergence CDF", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def _filled(buckets: Sequence[Any] | None) -> dict[tuple[Any, Any], Mapping[str, Any]]:
    """Buckets that hold tokens, by (start, end); empty ones are never drawn."""
    return {(b.get("start"), b.get("end")): b for b in buckets or []
            if isinstance(b, Mapping) and (b.get("n_tokens") or 0) > 0 and b.get("mean_kl") is not None}


def by_position_figure(block: Mapping[str, Any] | None, kl_bound: float | None = None,
                       top1_bound: float | None = None, floor: Mapping[str, Any] | None = None) -> Figure | None:
    """Token mean KL and same-top-1 rate per position bucket (only buckets with tokens), A/B
    beside the A/A floor, with the criterion's bound drawn over the floor so the axis holds it.

    `floor` is the overall A/A teacher block (its token means place the bound lines); the gate
    tests item means, so the lines are a guide to scale, not the test itself."""
    ab, aa = _filled((block or {}).get("ab")), _filled((block or {}).get("aa"))
    if not ab:
        return None
    keys = sorted(ab, key=lambda k: k[0] or 0)
    x = np.arange(len(keys))
    labels = [f"{s}–{e - 1}" if e is not None else f"{s}+" for s, e in keys]
    labels = [f"{lab}\n{ab[k]['n_tokens']:,} tok" for lab, k in zip(labels, keys)]
    fig = Figure(figsize=(6.4, 4.6))
    axes = fig.subplots(2, 1, sharex=True)
    floor_kl = F.num((floor or {}).get("mean_kl")) or 0.0
    floor_top1 = F.num((floor or {}).get("same_top1_rate"))
    floor_top1 = 1.0 if floor_top1 is None else floor_top1
    panels = ((axes[0], "mean_kl", "KL(base‖cand)\nnats/token", floor_kl + kl_bound if kl_bound is not None else None),
              (axes[1], "same_top1_rate", "same top-1", floor_top1 - top1_bound if top1_bound is not None else None))
    for ax, key, name, line in panels:
        ab_v = [float(ab[k][key]) for k in keys]
        ax.plot(x - 0.08, ab_v, "o", color=CAND, markersize=7, label="A/B (base vs cand)")
        aa_x = [i + 0.08 for i, k in enumerate(keys) if k in aa]
        aa_v = [float(aa[k][key]) for k in keys if k in aa]
        if aa_v:
            ax.plot(aa_x, aa_v, "s", color=FLOOR, markersize=6, markerfacecolor="white", markeredgewidth=1.6,
                    label="A/A floor (base vs base)")
        values = ab_v + aa_v
        if line is not None:
            ax.axhline(line, label="A/A floor + bound (the gate tests item means)" if key == "mean_kl"
                       else "A/A floor − bound (the gate tests item means)", **BOUND_STYLE)
            values.append(line)
        if key == "mean_kl":
            top = max(max(values) * 1.15, 1e-6)
            ax.set_ylim(-0.04 * top, top)
        else:
            low = min(values)
            ax.set_ylim(max(0.0, low - 0.15 * (1.0 - low) - 0.005), 1.0 + 0.1 * (1.0 - low) + 0.002)
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="best")
    axes[0].set_title("Teacher-forced divergence by token position (token means)", fontsize=10)
    axes[1].set_xticks(x, labels, fontsize=8)
    axes[1].set_xlim(-0.6, len(keys) - 0.4)
    axes[1].set_xlabel("token position in the completion (buckets holding tokens)")
    fig.tight_layout()
    return fig


def flips_figure(flips: Mapping[str, Any] | None, aa_flips: Mapping[str, tuple[Any, Any]]) -> Figure | None:
    """Right→wrong and wrong→right flips per suite; A/A flips marked as dashed ticks."""
    suites = sorted((flips or {}).keys())
    if not suites:
        return None
    fig = Figure(figsize=(6.4, 3.4))
    ax = fig.add_subplot()
    x = np.arange(len(suites))
    width = 0.38
    r2w = [int((flips[s] or {}).get("right_to_wrong") or 0) for s in suites]
    w2r = [int((flips[s] or {}).get("wrong_to_right") or 0) for s in suites]
    ax.bar(x - width / 2, r2w, width, color="#d62728", label="right→wrong (A/B)")
    ax.bar(x + width / 2, w2r, width, color="#2ca02c", label="wrong→right (A/B)")
    marked = False
    for i, s in enumerate(suites):
        floor = aa_flips.get(s)
        if not floor:
            continue
        for offset, value in ((-width / 2, floor[0]), (width / 2, floor[1])):
            if isinstance(value, (int, float)):
                ax.hlines(value, i + offset - width / 2, i + offset + width / 2,
                          label=None if marked else "A/A floor flips", **FLOOR_STYLE)
                marked = True
    ax.set_xticks(x, suites, rotation=20, fontsize=8)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("items")
    ax.set_title("Answer flips per suite", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def speed_figure(speed: Mapping[str, Any] | None) -> Figure | None:
    """Output tokens/s of each arm with the ratio and its CI, and latency p50/p95 side by side."""
    b, c = (speed or {}).get("baseline") or {}, (speed or {}).get("candidate") or {}
    tb, tc = F.num(b.get("output_tok_s")), F.num(c.get("output_tok_s"))
    if tb is None or tc is None:
        return None
    ratio = (speed or {}).get("ratio") or {}
    fig = Figure(figsize=(6.4, 3.4))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.3, 1]})
    left.barh([1, 0], [tb, tc], color=[BASE, CAND], height=0.6)
    for y, v in ((1, tb), (0, tc)):
        left.text(v, y, f" {F.sig3(v)}", va="center", fontsize=9)
    left.set_yticks([1, 0], ["baseline", "candidate"])
    left.set_xlim(0, max(tb, tc) * 1.25)
    left.set_xlabel("output tokens/s")
    est = F.num(ratio.get("estimate"))
    title = f"cand / base: {F.fmt_quantity(est, 'ratio')}" if est is not None else "cand / base: not measured"
    ci = F.fmt_quantity_interval(ratio.get("ci_low"), ratio.get("ci_high"), "ratio")
    left.set_title(title + ("" if ci == F.MISSING else f" {ci}\nper-request tokens/s"), fontsize=9)
    lat = [(k, F.num(b.get(k)), F.num(c.get(k))) for k in ("latency_p50", "latency_p95")]
    lat = [(k, vb, vc) for k, vb, vc in lat if vb is not None and vc is not None]
    if lat:
        x = np.arange(len(lat))
        right.bar(x - 0.19, [vb for _, vb, _ in lat], 0.38, color=BASE, label="baseline")
        right.bar(x + 0.19, [vc for _, _, vc in lat], 0.38, color=CAND, label="candidate")
        right.set_xticks(x, [k.replace("latency_", "") for k, _, _ in lat])
        right.set_ylabel("seconds per request")
        right.legend(fontsize=7)
        right.set_title("Request latency", fontsize=9)
    else:
        right.set_axis_off()
    fig.tight_layout()
    return fig


def all_plots(report: Mapping[str, Any]) -> dict[str, str | None]:
    """Every plot of the report by name (None where the data was not measured)."""
    plots = report.get("plots") or {}
    aa_flips = {}
    for name, block in (report.get("suites") or {}).items():
        task_aa = ((block or {}).get("task") or {}).get("aa")
        if task_aa:
            aa_flips[name] = (task_aa.get("flips_right_to_wrong"), task_aa.get("flips_wrong_to_right"))
    length = _criterion(report, "length_ratio")
    lo, hi = F.num(length.get("bound_low")), F.num(length.get("bound_high"))
    overall = F.get(report, "suites", "overall") or {}
    return {
        "lengths": to_data_uri(lengths_figure(plots.get("lengths"), (lo, hi) if lo is not None and hi is not None
                                              else None, F.get(overall, "generation", "ab"),
                                              F.get(overall, "generation", "aa"))),
        "length_drift": to_data_uri(length_drift_figure(plots.get("lengths"))),
        "length_distribution": to_data_uri(length_distribution_figure(plots.get("lengths"))),
        "first_divergence": to_data_uri(first_divergence_figure(plots.get("first_divergence"))),
        "by_position": to_data_uri(by_position_figure(
            plots.get("by_position"), F.num(_criterion(report, "kl_excess").get("bound_high")),
            F.num(_criterion(report, "top1_loss").get("bound_high")), F.get(overall, "teacher", "aa"))),
        "flips": to_data_uri(flips_figure(plots.get("flips"), aa_flips)),
        "speed": to_data_uri(speed_figure(report.get("speed"))),
    }


def trajectory_figure(verdict: Mapping[str, Any] | None) -> Figure | None:
    """Each primary criterion's interval at each look of a sequential compare, against its bound,
    in the criterion's units and coloured by its status at that look; None below two looks."""
    verdict = verdict or {}
    looks = (verdict.get("sequential") or {}).get("looks") or []
    crits = [c for c in verdict.get("criteria") or [] if c.get("role", "primary") == "primary"
             and c.get("status") != "not_evaluated" and not str(c.get("name", "")).startswith("failed_rate")]
    if len(looks) < 2 or not crits:
        return None
    cols = 2 if len(crits) > 1 else 1
    rows = -(-len(crits) // cols)
    fig = Figure(figsize=(5.6, 0.4 + 1.75 * rows))
    for i, c in enumerate(crits):
        ax = fig.add_subplot(rows, cols, i + 1)
        label = c.get("label") or c["name"]
        q = F.quantity(str(c["name"]))
        for lk in looks:
            p = (lk.get("criteria") or {}).get(label) or {}
            est = F.num(p.get("estimate"))
            if est is None:
                continue
            lo, hi = F.num(p.get("ci_low")), F.num(p.get("ci_high"))
            y = F.in_units(est, q)
            yl = F.in_units(lo if lo is not None else est, q)
            yh = F.in_units(hi if hi is not None else est, q)
            color = STATUS_COLOR.get(str(p.get("status")), FLOOR)
            ax.errorbar([lk["items"]], [y], yerr=[[max(0.0, y - yl)], [max(0.0, yh - y)]], fmt="o", color=color,
                        capsize=3, markersize=4)
        for bound in (c.get("bound_low"), c.get("bound_high")):
            if bound is not None:
                ax.axhline(F.in_units(float(bound), q), **BOUND_STYLE)
        name = D.short_label(c).removeprefix("the ")
        ax.set_title(f"{name} ({F.UNIT_TEXT[q].strip()})", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xticks([lk["items"] for lk in looks])
        ax.margins(x=0.15)
        if i >= len(crits) - cols:
            ax.set_xlabel("items judged", fontsize=7)
    fig.suptitle("Each look's interval; red dashes: the bound; colour: status then", fontsize=8)
    fig.tight_layout()
    return fig
