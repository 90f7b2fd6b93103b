"""The plots of report.html, as base64 PNG data URIs so the file opens offline.

Each `*_figure` function takes one block of report["plots"], draws the A/B comparison with
the A/A floor (baseline vs baseline) in grey dashes, and returns None when there is nothing
to draw; `all_plots` turns them into data URIs.
Figures are built with matplotlib's object API (no pyplot state) and PNGs carry no
timestamp or version metadata, so the same input gives the same bytes.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

BASE, CAND, FLOOR = "#1f77b4", "#ff7f0e", "#555555"
FLOOR_STYLE = {"color": FLOOR, "linestyle": "--", "linewidth": 1.6}


def to_data_uri(fig: Figure | None) -> str | None:
    """A figure as a base64 PNG data URI (no metadata, so stable bytes); None passes through."""
    if fig is None:
        return None
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _ints(values: Any) -> list[int]:
    return [int(v) for v in values or [] if isinstance(v, (int, float)) and not isinstance(v, bool)]


def lengths_figure(lengths: Mapping[str, Any] | None) -> Figure | None:
    """Output-length histograms of both arms; the A/A replicate as a dashed outline."""
    base, cand, aa = (_ints((lengths or {}).get(k)) for k in ("base", "cand", "aa"))
    if not base and not cand:
        return None
    fig = Figure(figsize=(7, 3.4))
    ax = fig.add_subplot()
    every = base + cand + aa
    bins = np.histogram_bin_edges(every, bins=min(40, max(5, len(set(every)))))
    ax.hist(base, bins=bins, alpha=0.55, color=BASE, label=f"baseline (n={len(base)})")
    ax.hist(cand, bins=bins, alpha=0.55, color=CAND, label=f"candidate (n={len(cand)})")
    if aa:
        ax.hist(aa, bins=bins, histtype="step", label=f"A/A replicate (n={len(aa)})", **FLOOR_STYLE)
    ax.set_xlabel("output length (tokens)")
    ax.set_ylabel("samples")
    ax.set_title("Output length distribution")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


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
    fig = Figure(figsize=(7, 3.4))
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
    ax.set_xlabel("token position of first divergence")
    ax.set_ylabel("share of pairs diverged")
    ax.set_title("First-divergence CDF")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig


def _bucket_series(buckets: Sequence[Mapping[str, Any]], key: str) -> tuple[list[str], list[float]]:
    labels, values = [], []
    for b in buckets or []:
        start, end = b.get("start"), b.get("end")
        labels.append(f"{start}–{end}" if end is not None else f"{start}+")
        value = b.get(key)
        values.append(float(value) if isinstance(value, (int, float)) else float("nan"))
    return labels, values


def by_position_figure(block: Mapping[str, Any] | None) -> Figure | None:
    """Mean KL and same-top-1 rate per token-position bucket, A/B against the A/A floor."""
    ab = list((block or {}).get("ab") or [])
    aa = list((block or {}).get("aa") or [])
    if not ab:
        return None
    fig = Figure(figsize=(7, 5.2))
    axes = fig.subplots(2, 1, sharex=True)
    labels, _ = _bucket_series(ab, "mean_kl")
    x = np.arange(len(labels))
    for ax, key, name in ((axes[0], "mean_kl", "mean KL(base‖cand)"),
                          (axes[1], "same_top1_rate", "same top-1 rate")):
        _, ab_values = _bucket_series(ab, key)
        ax.plot(x, ab_values, marker="o", color=CAND, label="A/B (base vs cand)")
        if aa:
            _, aa_values = _bucket_series(aa, key)
            aa_values = (aa_values + [float("nan")] * len(x))[: len(x)]
            ax.plot(x, aa_values, marker="s", label="A/A floor", **FLOOR_STYLE)
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[0].set_title("Teacher-forced divergence by token position")
    axes[0].legend(fontsize=8)
    axes[1].set_xticks(x, labels, rotation=30, fontsize=8)
    axes[1].set_xlabel("token position bucket")
    fig.tight_layout()
    return fig


def flips_figure(flips: Mapping[str, Any] | None, aa_flips: Mapping[str, tuple[Any, Any]]) -> Figure | None:
    """Right→wrong and wrong→right flips per suite; A/A flips marked as dashed ticks."""
    suites = sorted((flips or {}).keys())
    if not suites:
        return None
    fig = Figure(figsize=(7, 3.4))
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
    ax.set_ylabel("items")
    ax.set_title("Answer flips per suite")
    ax.legend(fontsize=8)
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
    return {
        "lengths": to_data_uri(lengths_figure(plots.get("lengths"))),
        "first_divergence": to_data_uri(first_divergence_figure(plots.get("first_divergence"))),
        "by_position": to_data_uri(by_position_figure(plots.get("by_position"))),
        "flips": to_data_uri(flips_figure(plots.get("flips"), aa_flips)),
    }


def trajectory_figure(verdict: Mapping[str, Any] | None) -> Figure | None:
    """Each primary criterion's interval at each look of a sequential compare, against its bound."""
    verdict = verdict or {}
    looks = (verdict.get("sequential") or {}).get("looks") or []
    crits = [c for c in verdict.get("criteria") or [] if c.get("role", "primary") == "primary"
             and c.get("status") != "not_evaluated" and not str(c.get("name", "")).startswith("failed_rate")]
    if not looks or not crits:
        return None
    cols = min(3, len(crits))
    rows = -(-len(crits) // cols)
    fig = Figure(figsize=(3.2 * cols, 2.4 * rows))
    for i, c in enumerate(crits):
        ax = fig.add_subplot(rows, cols, i + 1)
        label = c.get("label") or c["name"]
        pts = [(lk["items"], lk["criteria"].get(label) or {}) for lk in looks]
        xs = [x for x, p in pts if p.get("estimate") is not None]
        est = [p["estimate"] for _, p in pts if p.get("estimate") is not None]
        lo = [p["ci_low"] if p.get("ci_low") is not None else p["estimate"] for _, p in pts if p.get("estimate") is not None]
        hi = [p["ci_high"] if p.get("ci_high") is not None else p["estimate"] for _, p in pts if p.get("estimate") is not None]
        if xs:
            yerr = [np.maximum(0.0, np.subtract(est, lo)), np.maximum(0.0, np.subtract(hi, est))]
            ax.errorbar(xs, est, yerr=yerr, fmt="o", color=CAND, capsize=3)
        for bound in (c.get("bound_low"), c.get("bound_high")):
            if bound is not None:
                ax.axhline(bound, color="#c0392b", linestyle="--", linewidth=1.2)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("items judged", fontsize=8)
        ax.tick_params(labelsize=7)
        if xs:
            ax.set_xticks(xs)
    fig.suptitle("Intervals at each look; red dashes: the bound", fontsize=9)
    fig.tight_layout()
    return fig
