"""Plots: each supports a criterion, shows its bound on an honest scale, and marks the A/A floor."""

from __future__ import annotations

import copy

import numpy as np
from matplotlib.colors import to_rgba

from kvqual.report.plots import (BASE, BOUND, CAND, _divergence_cdf, all_plots, by_position_figure, first_divergence_figure,
                                 flips_figure, length_distribution_figure, length_drift_figure, lengths_figure,
                                 speed_figure, to_data_uri,
                                 trajectory_figure)


def _labels(ax) -> list[str]:
    return ax.get_legend_handles_labels()[1]


def _lengths(report):
    overall = report["suites"]["overall"]["generation"]
    return lengths_figure(report["plots"]["lengths"], (0.9, 1.1), overall["ab"], overall["aa"])


def test_every_comparison_plot_marks_the_aa_floor(report):
    aa = report["suites"]["arith"]["task"]["aa"]
    figures = {
        "lengths": _lengths(report).axes,  # the drift histogram has no A/A: the replicate's pairs are not stored
        "first_divergence": first_divergence_figure(report["plots"]["first_divergence"]).axes,
        "by_position": by_position_figure(report["plots"]["by_position"], 0.03, 0.08).axes,
        "flips": flips_figure(report["plots"]["flips"],
                              {"arith": (aa["flips_right_to_wrong"], aa["flips_wrong_to_right"])}).axes,
    }
    for name, axes in figures.items():
        for ax in axes:
            assert any(label.startswith("A/A") for label in _labels(ax)), (name, _labels(ax))


def test_no_floor_drawn_when_aa_missing(report):
    fig = lengths_figure(dict(report["plots"]["lengths"], aa=None), (0.9, 1.1), None, None)
    assert not any(label.startswith("A/A") for label in _labels(fig.axes[0]))


def test_length_plots_are_paired_and_draw_the_bound_without_translucent_overlays(report):
    (scatter,) = _lengths(report).axes
    assert "bound: mean ratio within [0.9, 1.1]" in _labels(scatter)
    assert sum(1 for line in scatter.get_lines() if line.get_color() == BOUND) == 2  # both sides of the wedge
    mean = next(label for label in _labels(scatter) if label.startswith("mean "))
    assert mean == "mean 39.5 → 48.8 tokens: 1.23× [0.950, 1.12]"  # the plotted pairs' ratio, the report's CI
    (diffs,) = length_drift_figure(report["plots"]["lengths"]).axes
    # one colour per element, nothing half-transparent to mix into brown
    for patch in diffs.patches + scatter.patches:
        assert patch.get_alpha() in (None, 1.0)
    base, cand = report["plots"]["lengths"]["base"], report["plots"]["lengths"]["cand"]
    assert sum(p.get_height() for p in diffs.patches) == len(base) == len(cand)  # one count per pair
    assert "same" in diffs.get_title() and "longer" in diffs.get_title()


def test_position_buckets_only_where_there_is_data_and_never_joined(report):
    block = copy.deepcopy(report["plots"]["by_position"])
    block["ab"][-1]["end"] = 256
    block["ab"].append({"start": 256, "end": None, "n_tokens": 0, "mean_kl": None, "same_top1_rate": None})
    fig = by_position_figure(block, 0.03, 0.08)
    ticks = [t.get_text().split("\n")[0] for t in fig.axes[1].get_xticklabels()]
    assert ticks == ["0–15", "16–63", "64–255"]  # the empty 256+ bucket is left out
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_label().startswith(("A/B", "A/A floor (")):
                assert line.get_linestyle() == "None"  # markers only: no line across a gap


def test_top1_axis_holds_the_bound_so_the_scale_is_honest():
    block = {"ab": [{"start": 0, "end": 64, "n_tokens": 100, "mean_kl": 0.005, "same_top1_rate": 0.978},
                    {"start": 64, "end": 256, "n_tokens": 50, "mean_kl": 0.001, "same_top1_rate": 0.998}],
             "aa": [{"start": 0, "end": 64, "n_tokens": 40, "mean_kl": 0.0, "same_top1_rate": 1.0}]}
    fig = by_position_figure(block, kl_bound=0.012, top1_bound=0.042, floor={"mean_kl": 0.0, "same_top1_rate": 1.0})
    kl, top1 = fig.axes
    low, high = top1.get_ylim()
    assert low <= 1.0 - 0.042 and high >= 1.0  # not zoomed to 0.978–1.000: the bound 4.2 points down is on the axis
    assert kl.get_ylim()[1] >= 0.012 and kl.get_ylim()[0] <= 0
    assert any(line.get_color() == BOUND for line in top1.get_lines())


def test_speed_plot_shows_each_arm_and_the_ratio(report):
    fig = speed_figure(report["speed"])
    throughput, latency = fig.axes
    assert [round(p.get_width(), 1) for p in throughput.patches] == [212.5, 251.0]
    assert throughput.get_title().startswith("cand / base: 1.18× [1.09, 1.27]")
    assert len(latency.patches) == 4  # p50 and p95, each arm side by side
    cand = to_rgba(CAND)
    assert sum(1 for p in latency.patches if p.get_facecolor() == cand) == 2
    assert speed_figure(None) is None and speed_figure({"baseline": {}, "candidate": {}}) is None


def test_trajectory_needs_two_looks_and_draws_each_bound(report):
    verdict = copy.deepcopy(report["verdict"])
    assert trajectory_figure(verdict) is None
    crit = verdict["criteria"][2]  # kl_excess
    crit["label"] = "kl_excess"
    verdict["criteria"] = [crit]
    verdict["sequential"] = {"looks": [
        {"look": 1, "items": 10, "criteria": {"kl_excess": {"estimate": 0.05, "ci_low": 0.02, "ci_high": 0.08,
                                                            "status": "inconclusive"}}},
        {"look": 2, "items": 20, "criteria": {"kl_excess": {"estimate": 0.041, "ci_low": 0.034, "ci_high": 0.049,
                                                            "status": "fail"}}}]}
    fig = trajectory_figure(verdict)
    ax = fig.axes[0]
    assert [line.get_ydata()[0] for line in ax.get_lines() if line.get_color() == BOUND] == [0.03]
    assert "nats/token" in ax.get_title()


def test_divergence_cdf_counts_identical_pairs_in_the_denominator():
    x, y, total = _divergence_cdf([None, 5, 2, None, 9])
    assert total == 5
    assert x.tolist() == [2.0, 5.0, 9.0]
    assert np.allclose(y, [0.2, 0.4, 0.6])  # never reaches 1: two pairs never diverged


def test_cdf_legend_reports_identical_counts():
    fig = first_divergence_figure({"ab": [None, 3, 4, None], "aa": [None, None, None, None]})
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["A/B (base vs cand): 2/4 identical", "A/A floor (base vs base): all 4 identical"]


def test_empty_inputs_give_no_figure():
    assert lengths_figure({"base": [], "cand": [], "aa": None}) is None
    assert length_drift_figure(None) is None
    assert first_divergence_figure({"ab": [], "aa": None}) is None
    assert by_position_figure(None) is None
    assert by_position_figure({"ab": [{"start": 0, "end": 16, "n_tokens": 0, "mean_kl": None}]}) is None
    assert flips_figure({}, {}) is None
    assert to_data_uri(None) is None


def test_png_bytes_are_stable(report):
    a, b = all_plots(report), all_plots(report)
    assert a == b and a["by_position"].startswith("data:image/png;base64,")


def test_length_distributions_of_both_arms_and_the_aa_replicate(report):
    (ax,) = length_distribution_figure(report["plots"]["lengths"]).axes
    labels = _labels(ax)
    assert [label.split(",")[0] for label in labels] == ["baseline", "candidate", "A/A replicate (baseline again"]
    base = np.array(report["plots"]["lengths"]["base"], float)
    assert labels[0] == (f"baseline, n={base.size}: p50 {np.percentile(base, 50):.1f}, "
                         f"p90 {np.percentile(base, 90):.1f}, p99 {np.percentile(base, 99):.1f}")
    base_line, cand_line, aa_line = ax.get_lines()[:3]
    assert to_rgba(base_line.get_color()) == to_rgba(BASE) and to_rgba(cand_line.get_color()) == to_rgba(CAND)
    assert aa_line.get_linestyle() == "--"
    # an ECDF: each curve climbs from 0 to 1 over its sorted lengths
    y = base_line.get_ydata()
    assert y[0] == 0 and y[-1] == 1 and np.all(np.diff(y) >= 0)
    assert sorted(base_line.get_xdata()[1:]) == sorted(base)


def test_length_distribution_marks_the_long_buckets_and_needs_a_baseline():
    lengths = {"base": [40, 300, 900, 1500, 2000], "cand": [45, 310, 1200, 2000, 2000], "aa": None}
    (ax,) = length_distribution_figure(lengths).axes
    assert len(_labels(ax)) == 2  # no replicate: nothing drawn for it
    assert ax.get_xscale() == "log"
    assert {line.get_xdata()[0] for line in ax.get_lines()[2:]} == {256, 1024}  # where the KL buckets start
    assert length_distribution_figure({"base": [], "cand": [3]}) is None
    assert length_distribution_figure(None) is None
