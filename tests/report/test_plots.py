"""Plots: every figure marks the A/A floor; the divergence CDF counts identical pairs right."""

from __future__ import annotations

import numpy as np

from kvqual.report.plots import (_divergence_cdf, by_position_figure, first_divergence_figure,
                                 flips_figure, lengths_figure, to_data_uri)


def _figures(report):
    plots = report["plots"]
    aa = report["suites"]["arith"]["task"]["aa"]
    return {
        "lengths": lengths_figure(plots["lengths"]),
        "first_divergence": first_divergence_figure(plots["first_divergence"]),
        "by_position": by_position_figure(plots["by_position"]),
        "flips": flips_figure(plots["flips"], {"arith": (aa["flips_right_to_wrong"], aa["flips_wrong_to_right"])}),
    }


def test_every_axes_of_every_plot_marks_the_aa_floor(report):
    for name, fig in _figures(report).items():
        assert fig is not None, name
        for ax in fig.axes:
            labels = ax.get_legend_handles_labels()[1]
            assert any(label.startswith("A/A") for label in labels), (name, labels)


def test_no_floor_drawn_when_aa_missing(report):
    fig = lengths_figure(dict(report["plots"]["lengths"], aa=None))
    assert not any(l.startswith("A/A") for l in fig.axes[0].get_legend_handles_labels()[1])


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
    assert first_divergence_figure({"ab": [], "aa": None}) is None
    assert by_position_figure(None) is None
    assert flips_figure({}, {}) is None
    assert to_data_uri(None) is None


def test_png_bytes_are_stable(report):
    a = to_data_uri(_figures(report)["by_position"])
    b = to_data_uri(_figures(report)["by_position"])
    assert a == b and a.startswith("data:image/png;base64,")
