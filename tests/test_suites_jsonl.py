import json
import re

import pytest

from kvqual.errors import SuiteError
from kvqual.suites import load_suites, suite_hash
from kvqual.suites.jsonl import load_jsonl_suite


def write_lines(tmp_path, lines, name="s.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_loads_prompt_and_chat_items(tmp_path):
    p = write_lines(tmp_path, [
        json.dumps({"id": "a", "prompt": "2+2=", "answer": 4, "scorer": "number"}),
        "",
        json.dumps({"id": "b", "messages": [{"role": "user", "content": "hi"}], "category": "chat"}),
        json.dumps({"id": "c", "prompt": [1, 2, 3], "max_tokens": 5}),
    ])
    items = load_jsonl_suite(p)
    assert [i.id for i in items] == ["a", "b", "c"]
    assert items[0].api == "completions" and items[0].answer == "4" and items[0].scored
    assert items[1].api == "chat" and not items[1].scored and items[1].suite == "s"
    assert items[2].prompt == (1, 2, 3) and items[2].max_tokens == 5


def test_default_scorer_is_exact_when_answer_given(tmp_path):
    p = write_lines(tmp_path, [json.dumps({"id": "a", "prompt": "x", "answer": "y"})])
    assert load_jsonl_suite(p)[0].scorer == "exact"


@pytest.mark.parametrize("lines, line, words", [
    (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], 2, "duplicate id 'a' (first on line 1)"),
    (['{"id": "a", "prompt": "x"}', '{not json'], 2, "not valid JSON"),
    (['{"id": "a"}'], 1, "exactly one of 'prompt'"),
    (['{"id": "a", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}'], 1, "exactly one of"),
    (['[1, 2]'], 1, "expected a JSON object"),
    (['{"prompt": "x"}'], 1, "missing or empty 'id'"),
    (['{"id": "a", "prompt": "x", "max_tokens": -3}'], 1, "max_tokens"),
    (['{"id": "a", "prompt": "x", "answer": "1", "scorer": "telepathy"}'], 1, "telepathy"),
    (['{"id": "a", "prompt": "x", "colour": "red"}'], 1, "unknown field(s) colour"),
    (['{"id": "a", "messages": [{"role": "user"}]}'], 1, "role' and 'content"),
])
def test_bad_lines_name_file_and_line(tmp_path, lines, line, words):
    p = write_lines(tmp_path, lines)
    with pytest.raises(SuiteError) as info:
        load_jsonl_suite(p)
    assert info.value.line == line
    assert str(info.value).startswith(f"{p}:{line}: ") and words in str(info.value)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(SuiteError, match="file not found"):
        load_jsonl_suite(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(SuiteError, match="no items"):
        load_jsonl_suite(tmp_path / "e.jsonl")


def test_limit_and_hash(tmp_path):
    p = write_lines(tmp_path, [json.dumps({"id": str(i), "prompt": f"p{i}"}) for i in range(10)])
    full, = load_suites([str(p)], seed=0, limit=None)
    five, = load_suites([str(p)], seed=0, limit=5)
    assert full.ref.n_items == 10 and five.ref.n_items == 5
    assert full.ref.sha256 != five.ref.sha256
    assert five.ref.sha256 == suite_hash(full.items[:5])


def test_duplicate_suite_names_refused(tmp_path):
    (tmp_path / "d").mkdir()
    a = write_lines(tmp_path, ['{"id": "a", "prompt": "x"}'])
    b = write_lines(tmp_path / "d", ['{"id": "a", "prompt": "x"}'])
    with pytest.raises(SuiteError, match="suite name 's' also used"):
        load_suites([str(a), str(b)], seed=0, limit=None)


def test_example_suite_ships_and_loads():
    items = load_jsonl_suite("suites/example.jsonl")
    assert len(items) >= 10 and any(i.scored for i in items) and any(i.api == "chat" for i in items)


def test_profile_and_category_specs_resolve():
    suites = load_suites(["profile:default"], seed=0, limit=None)
    by_name = {s.ref.name: s for s in suites}
    assert by_name["passkey"].ref.source == "builtin:passkey[len512,len1024]?seed=0"
    assert by_name["passkey"].ref.n_items == 136
    assert sum(s.ref.n_items for s in suites) == 2108
    assert [s.ref.n_items for s in load_suites(["profile:quick"], seed=0, limit=None)] == [8, 6, 24, 16, 40, 30]
    assert {it.category for it in by_name["passkey"].items} == {"len512", "len1024"}
    assert by_name["arith"].ref.source == "builtin:arith?seed=0"
    # --limit caps each entry; the spec form works on its own too
    three, = load_suites(["builtin:needles[len1024]@9"], seed=0, limit=3)
    assert [it.id for it in three.items] == ["needles-0003", "needles-0004", "needles-0005"]


@pytest.mark.parametrize("spec, words", [
    ("builtin:passkey@ten", "whole number, got 'ten'"),
    ("builtin:passkey[len7]@4", "no category 'len7'"),
    ("profile:fast", "unknown profile"),
])
def test_bad_builtin_specs_are_suite_errors(spec, words):
    with pytest.raises(SuiteError, match=re.escape(words)):
        load_suites([spec], seed=0, limit=None)
