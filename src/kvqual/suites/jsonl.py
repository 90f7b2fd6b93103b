"""User suite files: JSONL, one item per line (the contract in the brief).

Every problem is a `SuiteError` naming the file and the line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Iterator

from kvqual.errors import SuiteError
from kvqual.records import Item

_KNOWN = {"id", "prompt", "messages", "answer", "scorer", "scorer_params", "max_tokens",
          "category", "context_id", "meta"}


def parse_item(data: Any, *, suite: str, path: str, line: int) -> Item:
    """One decoded JSON value → an Item, or a SuiteError saying what is wrong."""
    def bad(problem: str) -> SuiteError:
        return SuiteError(path, line, problem)

    if not isinstance(data, dict):
        raise bad(f"expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(_KNOWN))})")
    item_id = data.get("id")
    if isinstance(item_id, int) and not isinstance(item_id, bool):
        item_id = str(item_id)
    if not isinstance(item_id, str) or not item_id:
        raise bad("missing or empty 'id' (a unique string)")
    prompt, messages = data.get("prompt"), data.get("messages")
    if (prompt is None) == (messages is None):
        raise bad(f"item {item_id!r} needs exactly one of 'prompt' (completions) or 'messages' (chat)")
    if prompt is not None:
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            prompt = tuple(prompt)
        elif not isinstance(prompt, str) or not prompt:
            raise bad(f"item {item_id!r}: 'prompt' must be a non-empty string or a list of token ids")
    if messages is not None:
        if not isinstance(messages, list) or not messages:
            raise bad(f"item {item_id!r}: 'messages' must be a non-empty list")
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise bad(f"item {item_id!r}: each message needs string 'role' and 'content'")
        messages = tuple(messages)
    answer = data.get("answer")
    if answer is not None and not isinstance(answer, (str, int, float)):
        raise bad(f"item {item_id!r}: 'answer' must be a string or a number")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    max_tokens = data.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise bad(f"item {item_id!r}: 'max_tokens' must be a positive integer")
    for name in ("category", "context_id"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise bad(f"item {item_id!r}: '{name}' must be a string")
    params = data.get("scorer_params") or {}
    if not isinstance(params, dict):
        raise bad(f"item {item_id!r}: 'scorer_params' must be an object")
    scorer = data.get("scorer")
    if scorer is not None:
        if not isinstance(scorer, str):
            raise bad(f"item {item_id!r}: 'scorer' must be a string")
        from kvqual.suites import scorers

        if answer is None and scorer in scorers.SCORERS and scorers.needs_answer(scorer, params):
            raise bad(f"item {item_id!r}: scorer {scorer!r} needs an 'answer'")

        try:
            scorers.validate(scorer, params)
        except ValueError as exc:
            raise bad(f"item {item_id!r}: {exc}") from None
    meta = data.get("meta") or {}
    if not isinstance(meta, dict):
        raise bad(f"item {item_id!r}: 'meta' must be an object")
    return Item(
        id=item_id, suite=suite, prompt=prompt, messages=messages, answer=answer,
        scorer=scorer if scorer is not None else ("exact" if answer is not None else None),
        scorer_params=params, max_tokens=max_tokens, category=data.get("category"),
        context_id=data.get("context_id"), meta=meta,
    )


def json_lines(lines: Iterable[str], path: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank JSONL line; SuiteError naming the line where one is not JSON."""
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            yield lineno, json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SuiteError(path, lineno, f"not valid JSON: {exc.msg} (column {exc.colno})") from None


def parse_lines(lines: Iterable[str], *, suite: str, path: str) -> list[Item]:
    """Parse JSONL lines (blank lines skipped); ids must be unique within the file."""
    items: list[Item] = []
    seen: dict[str, int] = {}
    for lineno, data in json_lines(lines, path):
        item = parse_item(data, suite=suite, path=path, line=lineno)
        if item.id in seen:
            raise SuiteError(path, lineno, f"duplicate id {item.id!r} (first on line {seen[item.id]})")
        seen[item.id] = lineno
        items.append(item)
    if not items:
        raise SuiteError(path, None, "no items")
    return items


def load_jsonl_suite(path: str | Path, suite: str | None = None) -> list[Item]:
    """Read a suite file; the suite's name defaults to the file's stem."""
    p = Path(path)
    name = suite or p.name.removesuffix(".gz").removesuffix(".jsonl")
    try:
        with p.open(encoding="utf-8") as fh:
            return parse_lines(fh, suite=name, path=str(path))
    except FileNotFoundError:
        raise SuiteError(str(path), None, "file not found") from None
    except UnicodeDecodeError as exc:
        raise SuiteError(str(path), None, f"not UTF-8 text: {exc}") from None
    except IsADirectoryError:
        raise SuiteError(str(path), None, "is a directory, not a JSONL file") from None
