"""lm-eval tasks through lm-eval's own API against local HTTP servers, paired by doc id."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kvqual.errors import SuiteError
from kvqual.suites.lmeval import SHIPPED_TASKS_DIR, parse_suite_spec, run_lmeval, samples_from_logged

from openai_server import openai_server

DATA = SHIPPED_TASKS_DIR / "kvqual_arith.jsonl"
TRUTH = {json.loads(line)["question"]: json.loads(line)["answer"] for line in DATA.read_text().splitlines()}
QUESTIONS = list(TRUTH)


def question_of(prompt: str) -> str:
    return prompt.rsplit("\n", 1)[1].removesuffix(" =")


def right(prompt: str) -> str:
    return " " + TRUTH[question_of(prompt)]


def wrong_on_even_docs(prompt: str) -> str:
    q = question_of(prompt)
    return f" {int(TRUTH[q]) + 1}" if QUESTIONS.index(q) % 2 == 0 else " " + TRUTH[q]


def test_shipped_task_paired_across_two_targets() -> None:
    with openai_server(right) as (base_a, seen_a), openai_server(wrong_on_even_docs) as (base_b, _):
        refs_a, a = run_lmeval(["kvqual_arith"], base_url=base_a, model="m", limit=8, concurrency=2)
        refs_b, b = run_lmeval(["kvqual_arith"], base_url=base_b, model="m", limit=8, concurrency=2)
    assert refs_a == refs_b and refs_a[0].name == "lm-eval:kvqual_arith" and refs_a[0].n_items == 8
    assert refs_a[0].source.endswith("kvqual_arith.yaml") and len(refs_a[0].sha256) == 64
    by_key_b = {s.key: s for s in b}
    assert sorted(s.key for s in a) == sorted(by_key_b) == sorted(("lm-eval:kvqual_arith", str(i), 0) for i in range(8))
    for s in a:
        other = by_key_b[s.key]
        assert s.error is None and s.score == 1.0 and s.text == " " + TRUTH[QUESTIONS[int(s.id)]]
        assert other.score == (0.0 if int(s.id) % 2 == 0 else 1.0)
    first = seen_a[0]
    assert first["path"] == "/v1/completions" and first["body"]["max_tokens"] == 8
    assert first["body"]["prompt"].startswith("2 + 3 = 5\n") and first["body"]["prompt"].endswith(" =")
    assert first["body"]["stop"] == ["\n"] and first["body"]["temperature"] == 0.0


def test_unknown_task_and_missing_dataset_fail_fast(tmp_path: Path) -> None:
    with pytest.raises(SuiteError, match="no such task"):
        run_lmeval(["kvqual_no_such_task"], base_url="http://127.0.0.1:9/v1", model="m")
    (tmp_path / "uncached.yaml").write_text(
        "task: kvqual_uncached\ndataset_path: kvqual-test/definitely-not-cached-anywhere\n"
        "output_type: generate_until\ntest_split: test\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n"
        "metric_list:\n  - metric: exact_match\n")
    t0 = time.monotonic()
    with pytest.raises(SuiteError, match="could not load the task data offline"):
        run_lmeval(["kvqual_uncached"], base_url="http://127.0.0.1:9/v1", model="m",
                   include_path=str(tmp_path))
    assert time.monotonic() - t0 < 60


def test_parse_suite_spec() -> None:
    assert parse_suite_spec("lm-eval:a, b") == ["a", "b"]
    with pytest.raises(SuiteError):
        parse_suite_spec("lm-eval:")


def test_samples_from_logged_keeps_first_filter_and_records_failures() -> None:
    logged = [
        {"doc_id": 0, "filter": "strict", "resps": [["7"]], "exact_match": 1.0},
        {"doc_id": 1, "filter": "strict", "resps": [[None]], "exact_match": 0.0},
        {"doc_id": 0, "filter": "flexible", "resps": [["7"]], "exact_match": 0.0},
    ]
    out = samples_from_logged("t", logged, output_type="generate_until", metric="exact_match")
    assert [(s.id, s.text, s.score, s.error is None) for s in out] == [("0", "7", 1.0, True), ("1", None, None, False)]
    mc = [{"doc_id": 3, "filter": "none", "resps": [[[-2.0, False]], [[-0.5, True]], [[-1.0, False]]], "acc": 1.0}]
    (s,) = samples_from_logged("mc", mc, output_type="multiple_choice", metric="acc")
    assert s.text == "1" and s.score == 1.0 and s.suite == "lm-eval:mc"
