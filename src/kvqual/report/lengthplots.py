"""The output-length figures of report.html: per-item lengths against the bound, the drift by
length, the distributions (report/plots.py re-exports them)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator, PercentFormatter

from kvqual.report import fmt as F
from kvqual.report.plotstyle import BASE, BOUND_STYLE, CAND, FLOOR, FLOOR_STYLE, PASS_ZONE, _ints


def _paired_lengths(lengths: Mapping[str, Any] | None) -> tuple[np.ndarray, np.ndarray]:
    base, cand = _ints((lengths or {}).get("base")), _ints((lengths or {}).get("cand"))
    n = min(len(base), len(cand))
    return np.array(base[:n], float), np.array(cand[:n], float)


def lengths_figure(lengths: Mapping[str, Any] | None, bound: tuple[float, float] | None = None,
                   ab: Mapping[str, Any] | None = None, aa: Mapping[str, Any] | None = None) -> Figure | None:
    """Paired output lengths: each item's baseline against candidate length, with the length
    criterion's bound as the wedge the mean point must sit in.

    `lengths` holds the paired lists (report["plots"]["lengths"]); `ab` / `aa` are the overall
    generation blocks (the ratio's CI, the A/A means). The A/A replicate's lengths are stored
    without their baseline partners, so only its mean point is drawn."""
    b, c = _paired_lengths(lengths)
    n = b.size
    if not n:
        return None
    fig = Figure(figsize=(6.4, 4.6))
    left = fig.add_subplot()
    # lengths span decades (8-token answers beside 200-token runaways): log axes when none is 0,
    # where the ±δ bound is a band of constant width around the diagonal
    log = bool(b.min() >= 1 and c.min() >= 1 and max(b.max(), c.max()) / min(b.min(), c.min()) >= 8)
    floor = 0.8 * min(b.min(), c.min()) if log else 0.0
    top = max(float(b.max()), float(c.max()), 1.0) * (1.25 if log else 1.08)
    xs = np.geomspace(max(floor, 1e-3), top, 50) if log else np.array([0.0, top])
    if bound is not None:
        left.fill_between(xs, bound[0] * xs, bound[1] * xs, color=PASS_ZONE, zorder=0, linewidth=0)
        for k, r in enumerate(bound):
            left.plot(xs, r * xs, label=f"bound: mean ratio within [{F.sig3(bound[0], trim=True)}, "
                      f"{F.sig3(bound[1], trim=True)}]" if k == 0 else None, zorder=1, **BOUND_STYLE)
    left.plot(xs, xs, color="#999999", linewidth=0.8, zorder=1)
    pairs, counts = np.unique(np.stack([b, c], axis=1), axis=0, return_counts=True)
    left.scatter(pairs[:, 0], pairs[:, 1], s=10 + 14 * np.sqrt(counts), color=CAND, edgecolors="white",
                 linewidths=0.4, zorder=2, label=f"items (n={n}; a bigger dot: several items)")
    ratio = float(c.mean() / b.mean()) if b.mean() > 0 else math.nan
    ci = F.fmt_quantity_interval(*((ab or {}).get("len_ratio_ci") or [None, None])[:2], "ratio")
    left.scatter([b.mean()], [c.mean()], marker="D", s=70, color="black", zorder=4,
                 label=f"mean {F.sig3(b.mean())} → {F.sig3(c.mean())} tokens: {F.sig3(ratio)}×"
                       + ("" if ci == F.MISSING else f" {ci}"))
    aa_b, aa_c = F.num((aa or {}).get("len_base_mean")), F.num((aa or {}).get("len_cand_mean"))
    if aa_b is not None and aa_c is not None:
        left.scatter([aa_b], [aa_c], marker="s", s=60, facecolors="none", edgecolors=FLOOR, linewidths=1.6,
                     zorder=3, label=f"A/A mean (base vs base again): {F.sig3(aa_b)} → {F.sig3(aa_c)}")
    if log:
        ticks = [m * 10 ** e for e in range(0, 7) for m in (1, 2, 5) if floor <= m * 10 ** e <= top]
        left.set_xscale("log")
        left.set_yscale("log")
        for axis in (left.xaxis, left.yaxis):
            axis.set_ticks(ticks, [f"{t:,}" for t in ticks])
            axis.set_minor_locator(NullLocator())
    left.set_xlim(floor, top)
    left.set_ylim(floor, top)
    left.set_xlabel("baseline output length (tokens)")
    left.set_ylabel("candidate output length (tokens)")
    left.set_title("Paired output lengths, one dot per item" + (" (log scales)" if log else ""), fontsize=10)
    # below the axes: the upper-left corner is where runaway outputs land, the lower-right cut-off ones
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


def length_drift_figure(lengths: Mapping[str, Any] | None) -> Figure | None:
    """Per-item length difference candidate − baseline (tokens): how many got longer or shorter."""
    b, c = _paired_lengths(lengths)
    if not b.size:
        return None
    fig = Figure(figsize=(6.4, 3.4))
    ax = fig.add_subplot()
    d = c - b
    lo, hi = int(d.min()), int(d.max())
    edges = np.arange(lo - 0.5, hi + 1.5, max(1, math.ceil((hi - lo + 1) / 40)))
    ax.hist(d, bins=edges, color=CAND, edgecolor="white", linewidth=0.3)
    ax.axvline(0, color="#999999", linewidth=0.8)
    same, longer, shorter = (float(np.mean(x)) for x in (d == 0, d > 0, d < 0))
    ax.set_title(f"Candidate − baseline length, per item: {F.fmt_pct(same)} same,\n"
                 f"{F.fmt_pct(longer)} longer, {F.fmt_pct(shorter)} shorter (n={d.size})", fontsize=9)
    ax.set_xlabel("length difference (tokens)")
    ax.set_ylabel("items")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def length_distribution_figure(lengths: Mapping[str, Any] | None) -> Figure | None:
    """The output-length distribution of each arm as an ECDF: baseline, candidate and the A/A replicate
    (the baseline run again), each with its p50 / p90 / p99 in the legend. Unpaired on purpose: a
    long-generation regression shows as the candidate's upper tail pulling away (runaway outputs, a
    pile-up at max_tokens: a vertical step at the right end) while the A/A curve stays on the
    baseline's; the paired scatter beside it says which items moved. The replicate covers its
    `--aa-fraction` of the items only (report.json stores its lengths without their baseline
    partners), so its curve is the same arm on fewer items: read its spread, not a step-for-step match."""
    arms = [(_ints((lengths or {}).get(key)), label, style) for key, label, style in (
        ("base", "baseline", {"color": BASE, "linewidth": 2}),
        ("cand", "candidate", {"color": CAND, "linewidth": 2}),
        ("aa", "A/A replicate (baseline again, its share of the items)", FLOOR_STYLE))]
    arms = [(np.sort(np.array(v, float)), label, style) for v, label, style in arms if v]
    if not arms or not any(key == "baseline" for _, key, _ in arms):
        return None
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.add_subplot()
    everything = np.concatenate([v for v, _, _ in arms])
    low, high = float(everything.min()), float(everything.max())
    log = bool(low >= 1 and high / low >= 8)
    for values, label, style in arms:
        share = np.arange(1, values.size + 1) / values.size
        q = np.percentile(values, (50, 90, 99))
        ax.step(np.concatenate([[values[0]], values]), np.concatenate([[0.0], share]), where="post",
                label=f"{label}, n={values.size}: p50 {F.sig3(q[0])}, p90 {F.sig3(q[1])}, p99 {F.sig3(q[2])}",
                **style)
    if log:
        ax.set_xscale("log")
        ticks = [m * 10 ** e for e in range(0, 7) for m in (1, 2, 5) if 0.8 * low <= m * 10 ** e <= 1.25 * high]
        ax.xaxis.set_ticks(ticks, [f"{t:,}" for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlim(0.8 * low, 1.25 * high)
    for at in (256, 1024):  # where the KL position buckets start: the share of outputs that reach them
        if low < at < high:
            ax.axvline(at, color="#bbbbbb", linewidth=0.8, zorder=0)
    ax.set_ylim(0, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("output length (tokens)" + (", log scale" if log else ""))
    ax.set_ylabel("outputs this long or shorter")
    ax.set_title("Output length distribution per arm (ECDF)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")  # ECDFs climb left to right: the upper left stays clear
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
