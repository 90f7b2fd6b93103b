"""Scorers: pure functions that turn (item, answer text) into 1.0 (right) or 0.0 (wrong).

Each item names one scorer in `scorer` (default `exact`) with optional `scorer_params`.
Scorers that check a constraint rather than a reference answer (`json_keys`,
`word_count`, `uppercase`, `lowercase`, `regex` with a `pattern`) ignore `answer`; items
using them still carry a human-readable `answer` (the constraint), so they count as scored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kvqual.records import Item

__all__ = ["SCORERS", "ScorerSpec", "DEFAULT_SCORER", "ANSWERLESS", "score", "validate",
           "needs_answer", "last_number"]

DEFAULT_SCORER = "exact"

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_WORD = re.compile(r"\S+")
_PUNCT = re.compile(r"[^\w\s]")


def _normalize(text: str, *, ignore_case: bool, ignore_space: bool, ignore_punct: bool) -> str:
    """Strip, collapse whitespace, drop a trailing period; optionally fold case, spaces, punctuation."""
    if ignore_punct:
        text = _PUNCT.sub(" ", text)
    out = " ".join(text.split()).rstrip(".")
    if ignore_space:
        out = "".join(out.split())
    return out.lower() if ignore_case else out


def last_number(text: str) -> float | None:
    """The last number written in `text` (commas as thousands separators), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _exact(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    if p.get("first_line", False):
        lines = [line for line in text.strip().splitlines() if line.strip()]
        text = lines[0] if lines else ""
    opts = {k: bool(p.get(k, False)) for k in ("ignore_case", "ignore_space", "ignore_punct")}
    got, want = _normalize(text, **opts), _normalize(answer or "", **opts)
    if p.get("prefix", False):  # the answer, then anything (e.g. a model that runs on)
        return got.startswith(want) and (len(got) == len(want) or not want[-1:].isalnum()
                                         or not got[len(want)].isalnum())
    return got == want


def _number(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    got, want = last_number(text), last_number(answer or "")
    if got is None or want is None:
        return False
    return abs(got - want) <= float(p.get("tol", 1e-6))


def _contains(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    needle = str(p.get("text", answer or ""))
    if p.get("ignore_case", True):
        return needle.lower() in text.lower()
    return needle in text


def _regex(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    pattern = p.get("pattern", answer or "")
    flags = 0
    for ch in p.get("flags", ""):
        flags |= {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}[ch]
    if p.get("fullmatch", False):
        return re.fullmatch(pattern, text.strip(), flags) is not None
    return re.search(pattern, text, flags) is not None


_CHOICE_STATED = re.compile(r"answer(?: is)?\s*[:\-]?\s*\(?([A-Z])\)?(?![A-Za-z])", re.IGNORECASE)


def _choice(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    letters = str(p.get("choices", "ABCD"))
    stated = [m.group(1).upper() for m in _CHOICE_STATED.finditer(text)]
    stated = [s for s in stated if s in letters]
    if stated:
        got = stated[-1]
    else:
        first = re.search(rf"(?<![A-Za-z])\(?([{letters}])\)?(?![A-Za-z])", text)
        got = first.group(1) if first else None
    return got is not None and got == (answer or "").strip().strip("()").upper()


def _first_json_object(text: str) -> Any:
    """Parse the first JSON object in `text` (code fences allowed); None if there is none."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _json_keys(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    value = _first_json_object(text)
    return value is not None and all(k in value for k in p["keys"])


def _passkey(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    return (answer or "").strip() in re.findall(r"\d+", text)


def _word_count(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    n = len(_WORD.findall(text))
    return p.get("min", 1) <= n <= p.get("max", 10**9)


def _uppercase(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and all(c.isupper() for c in letters)


def _lowercase(text: str, answer: str | None, p: Mapping[str, Any]) -> bool:
    letters = [c for c in text if c.isalpha()]
    return bool(letters) and all(c.islower() for c in letters)


@dataclass(frozen=True)
class ScorerSpec:
    """A scorer: its check, the params it accepts (name → type), whether it needs `answer`."""

    name: str
    check: Callable[[str, str | None, Mapping[str, Any]], bool]
    params: Mapping[str, type | tuple[type, ...]]
    needs_answer: bool
    required: tuple[str, ...] = ()
    description: str = ""


SCORERS: dict[str, ScorerSpec] = {
    s.name: s
    for s in (
        ScorerSpec("exact", _exact, {"ignore_case": bool, "ignore_space": bool, "ignore_punct": bool,
                            "first_line": bool, "prefix": bool},
                   True, description="text equals (or with prefix: starts with) the answer"),
        ScorerSpec("number", _number, {"tol": (int, float)}, True,
                   description="last number in the text equals the answer's number"),
        ScorerSpec("contains", _contains, {"ignore_case": bool, "text": str}, True,
                   description="answer (or params.text) appears in the text"),
        ScorerSpec("regex", _regex, {"pattern": str, "flags": str, "fullmatch": bool}, True,
                   description="params.pattern (else answer) matches the text"),
        ScorerSpec("choice", _choice, {"choices": str}, True,
                   description="the stated or first option letter equals the answer"),
        ScorerSpec("json_keys", _json_keys, {"keys": list}, False, required=("keys",),
                   description="the first JSON object in the text has every key in params.keys"),
        ScorerSpec("passkey", _passkey, {}, True,
                   description="the answer's digits appear as a whole number in the text"),
        ScorerSpec("word_count", _word_count, {"min": int, "max": int}, False,
                   description="the text has between params.min and params.max words"),
        ScorerSpec("uppercase", _uppercase, {}, False,
                   description="every letter of the text is upper case"),
        ScorerSpec("lowercase", _lowercase, {}, False,
                   description="every letter of the text is lower case"),
    )
}


def validate(name: str, params: Mapping[str, Any] | None = None) -> None:
    """Raise ValueError with a clear message when the scorer or its params are unusable."""
    if name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; known: {', '.join(sorted(SCORERS))}")
    spec, params = SCORERS[name], params or {}
    if not isinstance(params, Mapping):
        raise ValueError(f"scorer {name!r}: scorer_params must be an object")
    for key, value in params.items():
        if key not in spec.params:
            allowed = ", ".join(sorted(spec.params)) or "none"
            raise ValueError(f"scorer {name!r}: unknown param {key!r} (allowed: {allowed})")
        expected = spec.params[key]
        if isinstance(value, bool) and expected in (int, (int, float)):
            raise ValueError(f"scorer {name!r}: param {key!r} must be a number, got {value!r}")
        if not isinstance(value, expected):
            raise ValueError(f"scorer {name!r}: param {key!r} has the wrong type: {value!r}")
    for key in spec.required:
        if key not in params:
            raise ValueError(f"scorer {name!r}: param {key!r} is required")
    if name == "json_keys" and not all(isinstance(k, str) for k in params["keys"]):
        raise ValueError("scorer 'json_keys': params.keys must be a list of strings")
    if name == "regex" and "pattern" in params:
        if set(params.get("flags", "")) - set("ims"):
            raise ValueError("scorer 'regex': flags may hold only i, m, s")
        try:
            re.compile(params["pattern"])
        except re.error as exc:
            raise ValueError(f"scorer 'regex': bad pattern: {exc}") from None
    if name == "word_count" and not ({"min", "max"} & set(params)):
        raise ValueError("scorer 'word_count': give params.min and/or params.max")


def score(item: Item, text: str) -> float:
    """1.0 when `text` answers `item` by its scorer, else 0.0; unscored items are an error."""
    name = item.scorer or DEFAULT_SCORER
    spec = SCORERS.get(name)
    if spec is None:
        raise ValueError(f"item {item.id!r}: unknown scorer {name!r}")
    if needs_answer(name, item.scorer_params) and item.answer is None:
        raise ValueError(f"item {item.id!r}: scorer {name!r} needs an answer")
    return 1.0 if spec.check(text, item.answer, item.scorer_params) else 0.0


def needs_answer(name: str, params: Mapping[str, Any] | None = None) -> bool:
    """Whether scorer `name` compares with `answer` (regex with a params.pattern does not)."""
    if name == "regex":
        return "pattern" not in (params or {})
    return SCORERS[name].needs_answer


ANSWERLESS: frozenset[str] = frozenset(n for n, s in SCORERS.items() if not s.needs_answer) | {"regex"}
