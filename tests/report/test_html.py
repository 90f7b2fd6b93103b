"""report.html: self-contained, plots embedded, model text escaped, divergence marked."""

from __future__ import annotations

import base64
import re

from kvqual.report.html import example_views, render_html, split_at
from kvqual.report.plots import all_plots


def test_model_text_is_escaped(report):
    html = render_html(report)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;b&gt;bold&lt;/b&gt;" in html
    assert "<script" not in html.lower()
    assert "<b>" not in html


def test_self_contained_no_external_urls(report):
    html = render_html(report)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "<link" not in html and "@import" not in html
    assert "default-src 'none'" in html  # CSP: even an injected script could not run


def test_all_four_plots_are_embedded_pngs(report):
    html = render_html(report)
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(uris) == 4
    for uri in uris:
        assert base64.b64decode(uri)[:8] == b"\x89PNG\r\n\x1a\n"
    for name in ("lengths", "first_divergence", "by_position", "flips"):
        assert f'id="plot-{name}"><img' in html


def test_plots_absent_say_not_measured(null_report):
    assert all_plots(null_report) == {"lengths": None, "first_divergence": None, "by_position": None, "flips": None}
    html = render_html(null_report)
    assert "Output length distributions: not measured" in html
    assert "No samples recorded." in html and "No suite information recorded." in html


def test_output_is_deterministic(report):
    assert render_html(report) == render_html(report)


def test_divergence_point_is_marked(report):
    html = render_html(report)
    # candidate: "Here is HTML: " then the differing word, escaped, inside <mark>
    assert "Here is HTML: <mark>&lt;script&gt;alert(1)&lt;/script&gt;</mark>" in html
    assert "9 * 8 = <mark>63,</mark>" in html


def test_split_at_marks_one_word_and_handles_ends():
    assert split_at("abc def", 4) == split_at("abc def", 4)
    s = split_at("The answer is 42.", 4)
    assert (s.before, s.marked, s.after, s.ends_here) == ("The ", "answer", " is 42.", False)
    end = split_at("short", 5)
    assert end.ends_here and end.before == "short" and end.marked == ""
    assert split_at("same", None).before == "same"


def test_most_divergent_examples_first_identical_last(report):
    order = [v.id for v in example_views(report)]
    assert order == ["arith-3", "html-1", "arith-7", "arith-1"]
    assert [v.id for v in example_views(report, limit=2)] == ["arith-3", "html-1"]


def test_identical_example_is_labelled(report):
    assert "arith / arith-1 (repeat 0) — identical output" in render_html(report)
