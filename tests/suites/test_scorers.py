"""Scorers against hand-checked cases: each one passes and fails where a reader expects."""

from __future__ import annotations

import pytest

from kvqual.records import Item
from kvqual.suites import scorers
from kvqual.suites.scorers import last_number, score, validate


def item(scorer: str, answer: str | None = None, **params: object) -> Item:
    return Item(id="i", suite="s", prompt="p", answer=answer, scorer=scorer, scorer_params=params)


@pytest.mark.parametrize(
    ("it", "text", "want"),
    [
        (item("exact", "Paris"), "  Paris. ", 1.0),
        (item("exact", "Paris"), "paris", 0.0),
        (item("exact", "Paris", ignore_case=True), "paris", 1.0),
        (item("exact", "a b c"), "a  b\nc", 1.0),
        (item("exact", "1,2,3", ignore_space=True), "1, 2, 3", 1.0),
        (item("exact", "red green blue", ignore_punct=True), "red, green, blue", 1.0),
        (item("exact", "yes", first_line=True), "yes\nbecause ...", 1.0),
        (item("exact", "1, 2, 3", prefix=True), "1, 2, 3, 4, 5", 1.0),
        (item("exact", "1, 2, 3", prefix=True, ignore_punct=True), "1, 2, 34", 0.0),
        (item("exact", "1, 2, 3", prefix=True), "1, 2", 0.0),
        (item("number", "42"), "The answer is 42.", 1.0),
        (item("number", "42"), "42 apples, so 43 in all", 0.0),
        (item("number", "1234"), "It costs 1,234 dollars", 1.0),
        (item("number", "-7"), "x = -7", 1.0),
        (item("number", "0.5", tol=0.01), "about 0.499", 1.0),
        (item("number", "3"), "no number here", 0.0),
        (item("contains", "Bridge"), "a bridge over water", 1.0),
        (item("contains", "Bridge", ignore_case=False), "a bridge over water", 0.0),
        (item("contains", "x", text="water"), "a bridge over water", 1.0),
        (item("regex", "ans", pattern=r"^\W*yes\b", flags="i"), "Yes, of course", 1.0),
        (item("regex", "ans", pattern=r"^\W*yes\b", flags="i"), "Well, yes", 0.0),
        (item("regex", r"\d{3}"), "code 123", 1.0),
        (item("regex", "x", pattern=r"\d+", fullmatch=True), " 123 ", 1.0),
        (item("regex", "x", pattern=r"\d+", fullmatch=True), "123 apples", 0.0),
        (item("choice", "B"), "The answer is (B).", 1.0),
        (item("choice", "B"), "A is wrong; the answer is C", 0.0),
        (item("choice", "C"), "C. Because the others are wrong", 1.0),
        (item("choice", "(D)"), "Answer: D", 1.0),
        (item("choice", "A"), "I am not sure", 0.0),
        (item("json_keys", "JSON", keys=["name", "age"]), '```json\n{"name": "Al", "age": 3}\n```', 1.0),
        (item("json_keys", "JSON", keys=["name", "age"]), '{"name": "Al"}', 0.0),
        (item("json_keys", "JSON", keys=["a"]), "{not json} then {\"a\": 1}", 1.0),
        (item("json_keys", "JSON", keys=["a"]), "[1, 2]", 0.0),
        (item("passkey", "48213"), "The pass key is 48213.", 1.0),
        (item("passkey", "48213"), "The pass key is 482130.", 0.0),
        (item("passkey", "48213"), "4821", 0.0),
        (item("word_count", "≤3 words", max=3), "Blue sky here.", 1.0),
        (item("word_count", "≤3 words", max=3), "Blue sky over here.", 0.0),
        (item("word_count", "≥2 words", min=2), "One", 0.0),
        (item("uppercase", "caps"), "HELLO, WORLD 42!", 1.0),
        (item("uppercase", "caps"), "HELLO, World", 0.0),
        (item("uppercase", "caps"), "1234", 0.0),
        (item("lowercase", "low"), "hello there", 1.0),
        (item("lowercase", "low"), "Hello there", 0.0),
    ],
)
def test_scorer_cases(it: Item, text: str, want: float) -> None:
    assert score(it, text) == want


def test_last_number() -> None:
    assert last_number("1, 2 and finally 3.5") == 3.5
    assert last_number("none") is None
    assert last_number("12,345 and -0.25") == -0.25


def test_default_scorer_is_exact() -> None:
    it = Item(id="i", suite="s", prompt="p", answer="ok")
    assert score(it, "ok") == 1.0 and score(it, "okay") == 0.0


def test_score_refuses_missing_answer_and_unknown_scorer() -> None:
    with pytest.raises(ValueError, match="needs an answer"):
        score(item("number"), "3")
    with pytest.raises(ValueError, match="unknown scorer"):
        score(item("bleu", "x"), "x")
    assert score(item("regex", None, pattern="a"), "abc") == 1.0  # pattern given: no answer needed


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("bleu", {}, "unknown scorer 'bleu'"),
        ("exact", {"ignorecase": True}, "unknown param 'ignorecase'"),
        ("exact", {"ignore_case": "yes"}, "wrong type"),
        ("number", {"tol": True}, "must be a number"),
        ("json_keys", {}, "'keys' is required"),
        ("json_keys", {"keys": [1]}, "list of strings"),
        ("regex", {"pattern": "("}, "bad pattern"),
        ("regex", {"pattern": "a", "flags": "x"}, "flags may hold only"),
        ("word_count", {}, "min and/or params.max"),
        ("passkey", {"digits": 5}, "allowed: none"),
    ],
)
def test_validate_rejects(name: str, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate(name, params)


def test_validate_accepts_every_scorer_with_good_params() -> None:
    good = {"json_keys": {"keys": ["a"]}, "word_count": {"max": 3}, "regex": {"pattern": "a", "flags": "im"},
            "number": {"tol": 0.5}, "exact": {"prefix": True, "ignore_punct": True}}
    for name in scorers.SCORERS:
        validate(name, good.get(name, {}))
    assert {"exact", "number", "contains", "regex", "choice", "json_keys", "passkey"} <= set(scorers.SCORERS)
    assert scorers.ANSWERLESS == {"json_keys", "word_count", "uppercase", "lowercase", "regex"}
