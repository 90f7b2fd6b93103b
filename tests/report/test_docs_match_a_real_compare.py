"""The docs describe what kvqual really writes: every key path in docs/report-json.md exists in the
report.json of a real `kvqual compare` (two fake servers on loopback), nothing that report writes
goes undocumented, the junit names in docs/ci.md are the ones in its junit.xml, and the example
workflow's paths find its files. The same report.md also fits a PR comment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from kvtest import start_fake, write_suite

ROOT = Path(__file__).resolve().parents[2]
REPORT_DOC = ROOT / "docs" / "report-json.md"
CI_DOC = ROOT / "docs" / "ci.md"
WORKFLOW = ROOT / "examples" / "github-workflow.yml"

# `<arm>` and `<pair>` stand for these keys (docs/report-json.md); any other `<name>` for every key
PLACEHOLDERS = {"<arm>": ("baseline", "candidate", "aa"), "<pair>": ("ab", "aa")}
# documented paths this compare cannot reach (null or absent here), and why (each is checked elsewhere)
NOT_REACHED_HERE = {
    "capacity.": "tests/fakeserver.py reports no KV capacity (tests/test_sglang.py checks these keys)",
    "steady_speed": "written only with --speed-from (tests/test_speed_from.py checks these keys)",
    "teacher_forcing.through_cache.": "SGLang's scoring only (tests/test_sglang.py checks these keys)",
    "verdict.on_margin.": "only when a compare stops on its margin (tests/calibrate/test_calibrate.py reads them)",
    "verdict.planning.": "only when a plan ends undecided (tests/test_futility.py, tests/test_compare.py read them)",
}


@dataclass(frozen=True)
class Compare:
    folder: Path  # where kvqual ran
    out: Path  # results/compare-*/
    report: dict[str, Any]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compare]:
    """One real compare: a suite with answers and one without, a candidate that answers 30% wrong and
    drifts in its logprobs (so flips, examples and KL exist), Prometheus /metrics on both, a prompt
    longer than the servers' 300-token context, NaN logprobs on 5% of the candidate's prompts (so the
    report lists answers that were not data), and `min_speedup` set (so the speedup criterion is
    judged). About 10 s."""
    folder = tmp_path_factory.mktemp("real-compare")
    base = start_fake("--kv-cache-dtype", "bf16", "--metrics", "--max-model-len", "300")
    cand = start_fake("--kv-cache-dtype", "fp8_e4m3", "--wrong-rate", "0.3", "--logprob-noise", "0.3", "--metrics",
                      "--max-model-len", "300", "--nan-rate", "0.05")
    try:
        write_suite(folder / "arith.jsonl", [{"id": f"q{i}", "prompt": f"Question {i}: [[answer={i}]] A:",
                                              "answer": str(i), "scorer": "exact"} for i in range(40)])
        write_suite(folder / "free.jsonl", [{"id": f"f{i}", "prompt": f"Tell me about topic number {i}"}
                                            for i in range(40)]
                    + [{"id": "long", "prompt": "word " * 400 + "Summarise."}])  # does not fit 300 tokens
        (folder / "kvqual.toml").write_text(
            f'[targets.base]\nbase_url = "{base.base_url}"\nkv_cache_dtype = "bf16"\n'
            f'[targets.cand]\nbase_url = "{cand.base_url}"\nkv_cache_dtype = "fp8_e4m3"\n'
            '[gate]\nmin_speedup = 0.5\n', encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY" and not k.startswith("KVQUAL_")}
        done = subprocess.run([sys.executable, "-m", "kvqual", "compare", "base", "cand", "--suite", "arith.jsonl",
                               "--suite", "free.jsonl"], cwd=folder, env={**env, "CI": "true"},
                              capture_output=True, text=True, timeout=300)
    finally:
        base.stop()
        cand.stop()
    assert done.returncode in (0, 1, 3), done.stdout + done.stderr
    out, = (folder / "results").glob("compare-*/")
    yield Compare(folder, out, json.loads((out / "report.json").read_text(encoding="utf-8")))


# ---------------------------------------------------------------- docs/report-json.md

def documented() -> dict[str, str]:
    """Key path → type, from every table row of docs/report-json.md whose first cell is a `path`."""
    rows = {}
    for line in REPORT_DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)]
        if len(cells) >= 4 and re.fullmatch(r"`[^`]+`", cells[1]):
            rows[cells[1].strip("`")] = cells[2].replace("\\|", "|")
    return rows


def _segments(path: str) -> list[str]:
    return path.split(".")


def _matches(pattern: list[str], where: list[str]) -> bool:
    """Does a documented path (segments) name the concrete place `where` (keys; `k[]` for a list's elements)?"""
    if len(pattern) != len(where):
        return False
    for p, w in zip(pattern, where):
        p_list, w_list = p.endswith("[]"), w.endswith("[]")
        p_name, w_name = p.removesuffix("[]"), w.removesuffix("[]")
        if p_list != w_list:
            return False
        if p_name.startswith("<"):
            if p_name in PLACEHOLDERS and w_name not in PLACEHOLDERS[p_name]:
                return False
        elif p_name != w_name:
            return False
    return True


def _reach(node: Any, segs: list[str], where: list[str]) -> Iterator[tuple[str, list[str], Any]]:
    """Walk a documented path through the report: ("leaf", where, value) where it ends,
    ("null", where, None) where a value on the way is null, ("missing", where, None) where a
    documented key is absent."""
    if not segs:
        yield "leaf", where, node
        return
    if node is None:
        yield "null", where, None
        return
    seg, rest = segs[0], segs[1:]
    each, name = seg.endswith("[]"), seg.removesuffix("[]")
    assert isinstance(node, dict), f"{'.'.join(where)} is {type(node).__name__}, the docs say an object"
    if name.startswith("<"):
        keys = [k for k in node if name not in PLACEHOLDERS or k in PLACEHOLDERS[name]]
    elif name not in node:
        yield "missing", where + [name], None
        return
    else:
        keys = [name]
    for key in keys:
        child = node[key]
        if not each:
            yield from _reach(child, rest, where + [key])
        elif child is None:
            yield "null", where + [key], None
        else:
            assert isinstance(child, list), f"{'.'.join(where + [key])} is not a list"
            for element in child:
                yield from _reach(element, rest, where + [key + "[]"])


def _nullable(doc: dict[str, str], where: list[str]) -> bool:
    return any("null" in kind for path, kind in doc.items() if _matches(_segments(path), where))


def test_every_key_documented_in_report_json_md_is_in_a_real_report(real):
    doc = documented()
    assert len(doc) > 150  # the parser found the tables
    problems, reached = [], set()
    for path in doc:
        for event, where, value in _reach(real.report, _segments(path), []):
            if event == "missing" and not any(path.startswith(x) for x in NOT_REACHED_HERE):
                problems.append(f"{path}: no key {'.'.join(where)} in report.json")
            elif event == "null" and not _nullable(doc, where):
                problems.append(f"{path}: {'.'.join(where)} is null, but the docs do not say it may be")
            elif event == "leaf":
                reached.add(path)
                if value is None and not _nullable(doc, where):
                    problems.append(f"{path}: null in report.json, but its documented type is {doc[path]!r}")
    unreached = [p for p in doc if p not in reached and not any(p.startswith(x) for x in NOT_REACHED_HERE)]
    assert not problems, "\n".join(problems)
    assert not unreached, f"documented but not reached by the real compare: {unreached}"


def _places(node: Any, where: list[str]) -> Iterator[tuple[list[str], dict[str, Any]]]:
    if isinstance(node, dict):
        yield where, node
        for key, child in node.items():
            yield from _places(child, where + [key])
    elif isinstance(node, list):
        for element in node:
            yield from _places(element, where[:-1] + [where[-1] + "[]"] if where else ["[]"])


def test_nothing_a_real_report_writes_is_left_out_of_the_docs(real):
    """Every object whose keys the docs list is listed completely (objects documented only as a
    whole, like teacher_forcing.left_out, are free-form)."""
    patterns = [_segments(p) for p in documented()]
    missing = []
    for where, obj in _places(real.report, []):
        if where and not any(_matches(p[: len(where)], where) and len(p) > len(where) for p in patterns):
            continue  # its children are not documented one by one
        for key in obj:
            child = obj[key]
            names = [where + [key], where + [key + "[]"]] if isinstance(child, list) else [where + [key]]
            if not any(_matches(p[: len(n)], n) for p in patterns for n in names):  # itself, or its children
                missing.append(".".join(where + [key]))
    assert not missing, f"report.json keys missing from docs/report-json.md: {sorted(set(missing))}"


def test_the_criterion_names_in_report_json_md_are_the_gates(real):
    row = next(line for line in REPORT_DOC.read_text(encoding="utf-8").splitlines()
               if line.startswith("| `verdict.criteria[].name`"))
    listed = set(re.findall(r"`(\w+)`", row.split("|")[3]))
    # cache_path is only there when the compare holds a cache probe (tests/compare/test_cache_probe.py)
    assert listed - {"cache_path"} == {c["name"] for c in real.report["verdict"]["criteria"]}
    assert "cache_path" in listed and "only where the compare holds a cache probe" in row


# ---------------------------------------------------------------- docs/ci.md junit mapping

def _junit_doc() -> dict[str, str]:
    """name → classname, from the table in the 'junit.xml mapping' section of docs/ci.md."""
    section = CI_DOC.read_text(encoding="utf-8").split("## junit.xml mapping")[1].split("\n## ")[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 4 and re.fullmatch(r"`\w+`", cells[1]) and cells[1] != "`name`":  # not the header
            rows[cells[1].strip("`")] = cells[2]
    return rows


def test_every_junit_name_in_ci_md_is_in_a_real_junit_xml(real):
    doc = _junit_doc()
    cases = ET.parse(real.out / "junit.xml").getroot().findall("./testsuite/testcase")
    assert {c.get("name") for c in cases} == set(doc), "docs/ci.md's junit table and a real junit.xml differ"
    suites = {s["name"] for s in real.report["runs"]["baseline"]["suites"]}
    for case in cases:
        expected = doc[case.get("name")]
        if expected == "`overall`":
            assert case.get("classname") == "overall", case.attrib
        else:
            assert expected == "the suite's name" and case.get("classname") in suites, case.attrib
    text = CI_DOC.read_text(encoding="utf-8")
    assert "failed_rate_base`" not in text and "failed_rate_cand`" not in text


# ---------------------------------------------------------------- the workflow and report.md

def test_the_example_workflow_finds_the_files_a_real_compare_writes(real):
    steps = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]["kvqual"]["steps"]
    by_action = {s["uses"].split("@")[0]: s for s in steps if "uses" in s}
    globs = by_action["actions/upload-artifact"]["with"]["path"].split()
    globs += [by_action["mikepenz/action-junit-report"]["with"]["report_paths"],
              by_action["marocchino/sticky-pull-request-comment"]["with"]["path"]]
    for pattern in globs:
        assert list(real.folder.glob(pattern)) == [real.out / Path(pattern).name], pattern


def test_the_real_report_md_fits_a_pr_comment(real):
    from test_markdown import PR_COMMENT_LINES, outside_details

    text = (real.out / "report.md").read_text(encoding="utf-8")
    assert len(outside_details(text)) <= PR_COMMENT_LINES
    assert text.startswith(f"## kvqual: **{real.report['verdict']['verdict']}** — base → cand")
