"""report.html: self-contained, plots embedded, model text escaped, divergence marked."""

from __future__ import annotations

import base64
import copy
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


PLOT_NAMES = ("lengths", "length_drift", "length_distribution", "by_position", "first_divergence", "flips", "speed")


def test_every_plot_is_an_embedded_png(report):
    html = render_html(report)
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(uris) == len(PLOT_NAMES)  # no trajectory: the sample was judged at one look
    for uri in uris:
        assert base64.b64decode(uri)[:8] == b"\x89PNG\r\n\x1a\n"
    for name in PLOT_NAMES:
        assert f'id="plot-{name}"><img' in html


def test_plots_absent_say_not_measured(null_report):
    assert all_plots(null_report) == dict.fromkeys(PLOT_NAMES)
    html = render_html(null_report)
    assert "Output lengths: paired per item, with the length criterion&#39;s bound: not measured" in html
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


# ---------------------------------------------------------------- the decision leads the page

EMOJI = re.compile("[\U0001F000-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\uFE0F]")


def test_responsive_page_has_a_viewport_and_every_table_scrolls_in_its_own_box(report):
    html = render_html(report)
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in html
    assert html.count("<table") == html.count('<div class="scroll">\n<table') == 6  # no looks table at one look; positions
    assert ".scroll { overflow-x: auto;" in html and "max-width: 100%" in html and "flex-wrap: wrap" in html


def test_no_emoji_anywhere_in_the_page(report, null_report):
    for r in (report, null_report, dict(report, allow_mismatch=True)):
        found = EMOJI.findall(render_html(r))
        assert not found, found  # status marks are SVG shapes and words: no emoji font needed


def test_the_decision_comes_first_badge_why_next_then_forest(report):
    html = render_html(report)
    order = [html.index(x) for x in ('id="verdict-badge"', 'id="why"', 'id="next"', 'id="forest"', 'id="criteria"')]
    assert order == sorted(order)
    assert ("KL beyond the A/A floor is outside its bound: 0.0410 nats/token [0.0340, 0.0490], "
            "bound ≤ 0.03 nats/token.") in html
    assert "Do not ship fp8: its token distributions moved" in html
    assert "Warning: fp8 server reported kv_scale 1.0 for every layer" in html.split('id="forest"')[0]


def _with_verdict(report, verdict: str, status: str):
    r = copy.deepcopy(report)
    r["verdict"]["verdict"] = verdict
    for c in r["verdict"]["criteria"]:
        if c["status"] in ("fail", "inconclusive"):
            c["status"] = status
    return r


def test_three_verdicts_look_different_in_colour_shape_and_word(report):
    badges = {}
    for verdict, status in (("PASS", "pass"), ("FAIL", "fail"), ("INCONCLUSIVE", "inconclusive")):
        html = render_html(_with_verdict(report, verdict, status))
        badge = re.search(r'<div class="badge (\w+)" id="verdict-badge">(<svg.*?</svg>)<span>(\w+)</span>', html, re.S)
        assert badge and badge.group(1) == badge.group(3) == verdict
        badges[verdict] = badge.group(2)
    assert len(set(badges.values())) == 3  # three different shapes
    css = render_html(report)
    colours = {v: re.search(rf"\.badge\.{v} {{ background: var\(--(\w+)\)", css).group(1) for v in badges}
    values = {v: re.search(rf"--{name}: (#[0-9a-f]{{6}})", css).group(1) for v, name in colours.items()}
    assert len(set(values.values())) == 3, values


def test_forest_has_one_row_per_criterion_with_units_and_status_words(report):
    html = render_html(report)
    forest = html.split('id="forest"')[1].split('<div class="side">')[0]
    assert forest.count('<div class="frow ') == len(report["verdict"]["criteria"]) == 7
    assert "−5.00 points [−16.0, +6.00]" in forest  # accuracy in points, three significant figures
    assert "0.0410 nats/token [0.0340, 0.0490]" in forest
    assert "1.02× [0.950, 1.08]" in forest and "0% [0%, 7.20%]" in forest
    for word in ("pass", "fail", "inconclusive", "not judged"):  # the words the console and report.md use
        assert f">{word}</span>" in forest
    assert "not drawn: speed not measured (no min_speedup)" in forest


def test_kl_figures_say_item_mean_or_token_mean(report):
    html = render_html(report)
    assert "mean KL beyond A/A floor (item mean)" in html
    assert "mean KL(base‖cand), token mean" in html
    assert "nats per token" in html


def test_a_slower_candidate_is_flagged_beside_the_verdict(report):
    r = copy.deepcopy(report)
    r["speed"]["ratio"] = {"estimate": 0.59, "ci_low": 0.5, "ci_high": 0.7}
    head = render_html(r).split('id="forest"')[0]
    assert 'class="flag">candidate slower: 0.590× [0.500, 0.700] the baseline' in head
    r["speed"]["ratio"]["ci_high"] = 1.02  # not shown slower: a note, not a flag
    assert "candidate not shown slower: 0.590×" in render_html(r).split('id="forest"')[1]
    r["speed"]["slower"] = "the candidate is slower"  # report.json's own flag decides when present
    assert 'class="flag">candidate slower' in render_html(r)
    assert "candidate slower" not in render_html(report).split('id="forest"')[0]


def test_sequential_trajectory_sits_beside_the_forest(report):
    r = copy.deepcopy(report)
    labels = {c["name"]: c["name"] + (f"[{c['suite']}]" if c["suite"] else "") for c in r["verdict"]["criteria"]}
    for c in r["verdict"]["criteria"]:
        c["label"] = labels[c["name"]]
    r["verdict"]["sequential"] = {"planned_looks": 2, "stop": "decided at look 2 of 2 (20 of 20 items)", "looks": [
        {"look": k, "items": n, "verdict": "INCONCLUSIVE", "criteria": {
            c["label"]: {"estimate": c["estimate"], "ci_low": c["ci_low"], "ci_high": c["ci_high"],
                         "status": c["status"], "n": n} for c in r["verdict"]["criteria"]}}
        for k, n in ((1, 10), (2, 20))]}
    html = render_html(r)
    figs = html.split('<div class="figs">')[1].split("<h2>")[0]
    assert 'id="forest"' in figs and 'id="plot-trajectory"><img' in figs
    assert "decided at look 2 of 2 (20 of 20 items)" in html.split('id="forest"')[0]


def test_kl_by_position_is_a_table_with_every_bucket_and_the_aa_floor(report):
    long = copy.deepcopy(report)
    long["plots"]["by_position"] = {
        "ab": [{"start": 0, "end": 64, "n_tokens": 640, "mean_kl": 0.012, "same_top1_rate": 0.95},
               {"start": 64, "end": 256, "n_tokens": 1900, "mean_kl": 0.019, "same_top1_rate": 0.93},
               {"start": 256, "end": 1024, "n_tokens": 4100, "mean_kl": 0.031, "same_top1_rate": 0.9},
               {"start": 1024, "end": None, "n_tokens": 0, "mean_kl": None, "same_top1_rate": None}],
        "aa": [{"start": 256, "end": 1024, "n_tokens": 4100, "mean_kl": 0.002, "same_top1_rate": 0.988}]}
    html = render_html(long)
    table = html[html.index('<table id="positions">'):]
    table = table[:table.index("</table>")]
    assert "<td>256–1,023</td><td class=\"num\">4,100</td><td class=\"num\">0.0310 nats/token</td>" in table
    assert "0.00200 nats/token" in table and "98.8%" in table
    assert "<td>1,024+</td><td class=\"num\">0</td>" in table  # a bucket no output reached says so
    assert '<table id="positions">' not in render_html(dict(long, plots={}))
