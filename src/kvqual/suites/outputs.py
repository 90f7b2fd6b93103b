"""Outputs a config already produced, read for `kvqual audit` (docs/audit.md "Accepted shapes").

One JSON object a line, in one of the shapes engines and datasets write:

- `{"prompt": "...", "completion": "..."}` (or `"messages": [...]` for chat; `"response"` or
  `"output"` as the completion's key): kvqual's own shape;
- `{"messages": [..., {"role": "assistant", "content": "..."}]}`: a chat transcript whose last turn is
  the completion (the shape of most fine-tuning and distillation sets);
- `{"prompt": "...", "outputs": [{"text": "...", "token_ids": [...], "finish_reason": "..."}]}`: vLLM's
  `RequestOutput` as JSON (the first output is audited);
- an OpenAI Batch API output line (`custom_id`, `response.body` a chat or text completion) with
  `--batch-input` naming the batch's input file (the prompts are only there).

Optional fields on any shape: `id` (else `custom_id`, else the line number), `category`,
`context_id`, `max_tokens`, `finish_reason`, `completion_token_ids`.

The file is read once, streaming, and the sample is drawn as it goes (`draw`): memory grows with
the sample, never with the file. A line kvqual cannot read stops the audit with exit 2 naming the
file and the line (`SuiteError`).
"""

from __future__ import annotations

import hashlib
import heapq
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from kvqual.errors import SuiteError
from kvqual.records import Item
from kvqual.suites.jsonl import json_lines, parse_item

SUITE = "audit"  # the suite name every audited item carries
COMPLETION_KEYS = ("completion", "response", "output")


@dataclass(frozen=True)
class Output:
    """One audited output: the prompt as an `Item` and the completion as the file gave it."""

    item: Item
    text: str
    line: int
    token_ids: tuple[int, ...] | None = None
    finish_reason: str | None = None
    custom_id: str | None = None  # a batch output waiting for its prompt (`--batch-input`)

    @property
    def stratum(self) -> str:
        """The category where the file gives one, else the completion's length class (powers of 2 in
        characters): the strata the sample is drawn over."""
        if self.item.category:
            return f"category:{self.item.category}"
        return f"chars<{2 ** max(4, math.ceil(math.log2(len(self.text) + 1)))}"


def _ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return tuple(value)
    return None


def _batch_completion(body: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The text and finish reason of a batch line's response body (chat or text completion)."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None, None
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, Mapping) else choice.get("text")
    return (text if isinstance(text, str) else None), choice.get("finish_reason")


def parse_output(data: Any, path: str, line: int) -> Output:
    """One line of an outputs file as an `Output`; SuiteError naming the line when it is none of the
    accepted shapes."""
    def bad(problem: str) -> SuiteError:
        return SuiteError(path, line, problem)

    if not isinstance(data, dict):
        raise bad(f"expected a JSON object, got {type(data).__name__}")
    item_id = data.get("id", data.get("custom_id", f"L{line}"))
    if not isinstance(item_id, (str, int)) or isinstance(item_id, bool):
        raise bad("'id' must be a string or an integer")
    base = {k: data[k] for k in ("category", "context_id", "max_tokens") if data.get(k) is not None}
    token_ids, finish = _ids(data.get("completion_token_ids")), data.get("finish_reason")
    if isinstance(data.get("response"), Mapping) and "custom_id" in data:  # an OpenAI Batch API output line
        response = data["response"]
        if data.get("error") or response.get("status_code", 200) != 200:
            raise bad(f"batch request {data['custom_id']!r} failed ({data.get('error') or response.get('status_code')}):"
                      " there is no output to audit; leave the line out")
        text, finish = _batch_completion(response.get("body") or {})
        if text is None:
            raise bad("batch output without a completion text in response.body.choices[0]")
        item = Item(id=str(data["custom_id"]), suite=SUITE, prompt="")
        return Output(item, text, line, None, finish, str(data["custom_id"]))
    if isinstance(data.get("outputs"), list):  # vLLM's RequestOutput as JSON
        first = data["outputs"][0] if data["outputs"] else None
        if not isinstance(first, Mapping) or not isinstance(first.get("text"), str):
            raise bad("'outputs' must hold an object with a 'text' string")
        text, token_ids, finish = first["text"], _ids(first.get("token_ids")) or token_ids, first.get("finish_reason")
    else:
        key = next((k for k in COMPLETION_KEYS if isinstance(data.get(k), str)), None)
        messages = data.get("messages")
        if key is not None:
            text = data[key]
        elif (isinstance(messages, list) and messages and isinstance(messages[-1], Mapping)
              and messages[-1].get("role") == "assistant" and isinstance(messages[-1].get("content"), str)):
            text, data = messages[-1]["content"], {**data, "messages": messages[:-1]}
            if not data["messages"]:
                raise bad("a chat transcript needs a turn before the assistant's")
        else:
            raise bad("no completion: expected 'completion' (or 'response', 'output'), 'outputs' (vLLM), a "
                      "'messages' transcript ending with the assistant's turn, or an OpenAI batch output line "
                      "(docs/audit.md, Accepted shapes)")
    prompt = {k: data[k] for k in ("prompt", "messages") if k in data}
    if "prompt_token_ids" in data and "prompt" not in prompt:
        prompt["prompt"] = data["prompt_token_ids"]
    item = parse_item({"id": str(item_id), **prompt, **base}, suite=SUITE, path=path, line=line)
    return Output(item, text, line, token_ids, finish if isinstance(finish, str) else None)


def read(path: str | Path) -> Iterator[Output]:
    """Every output of a file, one line at a time (blank lines skipped)."""
    p = Path(path)
    try:
        with p.open(encoding="utf-8") as fh:
            for line, data in json_lines(fh, str(path)):
                yield parse_output(data, str(path), line)
    except FileNotFoundError:
        raise SuiteError(str(path), None, "file not found") from None
    except IsADirectoryError:
        raise SuiteError(str(path), None, "is a directory, not a JSONL file") from None
    except UnicodeDecodeError as exc:
        raise SuiteError(str(path), None, f"not UTF-8 text: {exc}") from None


def _key(seed: int, line: int) -> float:
    """A line's uniform draw in [0, 1), from the seed and its line number alone."""
    digest = hashlib.sha256(f"{seed}:{line}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class Drawn:
    """The sample and what it was drawn from: lines read and outputs per stratum."""

    outputs: tuple[Output, ...]
    lines: int
    strata: Mapping[str, int]  # stratum → outputs in the file
    allocation: Mapping[str, int]  # stratum → outputs sampled


def allocate(counts: Mapping[str, int], n: int) -> dict[str, int]:
    """Proportional allocation of n over the strata (largest remainders; never above a stratum's size)."""
    total = sum(counts.values())
    if n >= total:
        return dict(counts)
    exact = {s: n * c / total for s, c in counts.items()}
    out = {s: min(counts[s], int(x)) for s, x in exact.items()}
    for s in sorted(counts, key=lambda s: (-(exact[s] - int(exact[s])), s)):
        if sum(out.values()) >= n:
            break
        if out[s] < counts[s]:
            out[s] += 1
    return out


def draw(path: str | Path, n: int, seed: int) -> Drawn:
    """A seeded sample of n outputs, stratified (proportional allocation) by `Output.stratum`, drawn
    in one streaming pass: each stratum keeps the n lines of smallest draw (`_key`) seen so far, so
    memory holds at most n outputs a stratum whatever the file's size; a line's draw depends on the
    seed and its line number only, so the same file and seed give the same sample."""
    heaps: dict[str, list[tuple[float, int, Output]]] = {}
    counts: dict[str, int] = {}
    lines = 0
    for out in read(path):
        lines += 1
        s = out.stratum
        counts[s] = counts.get(s, 0) + 1
        heap = heaps.setdefault(s, [])
        entry = (-_key(seed, out.line), out.line, out)
        if len(heap) < n:
            heapq.heappush(heap, entry)
        elif entry[0] > heap[0][0]:
            heapq.heapreplace(heap, entry)
    if not lines:
        raise SuiteError(str(path), None, "no outputs")
    alloc = allocate(counts, n)
    chosen = [e[2] for s, heap in heaps.items() for e in sorted(heap, key=lambda e: -e[0])[:alloc[s]]]
    chosen.sort(key=lambda o: o.line)
    seen: dict[str, int] = {}
    for o in chosen:
        if o.item.id in seen:
            raise SuiteError(str(path), o.line, f"duplicate id {o.item.id!r} (also on line {seen[o.item.id]})")
        seen[o.item.id] = o.line
    return Drawn(tuple(chosen), lines, counts, alloc)


def join_batch_input(drawn: Drawn, path: str | Path) -> Drawn:
    """Give sampled OpenAI batch outputs their prompts from the batch's input file (one streaming
    pass, keeping only the sampled `custom_id`s); exit 2 naming the file when one is missing."""
    waiting = {o.custom_id: o for o in drawn.outputs if o.custom_id is not None}
    if not waiting:
        return drawn
    found: dict[str, Output] = {}
    try:
        with Path(path).open(encoding="utf-8") as fh:
            for line, data in json_lines(fh, str(path)):
                cid = data.get("custom_id") if isinstance(data, dict) else None
                if cid not in waiting:
                    continue
                body = data.get("body")
                if not isinstance(body, Mapping):
                    raise SuiteError(str(path), line, "batch input line without a 'body' object")
                o = waiting[cid]
                fields = {k: body[k] for k in ("prompt", "messages", "max_tokens") if body.get(k) is not None}
                item = parse_item({"id": o.item.id, **fields}, suite=SUITE, path=str(path), line=line)
                found[cid] = replace(o, item=item, custom_id=None)
    except FileNotFoundError:
        raise SuiteError(str(path), None, "file not found (--batch-input)") from None
    missing = [cid for cid in waiting if cid not in found]
    if missing:
        raise SuiteError(str(path), None, f"{len(missing)} sampled batch outputs have no input line here "
                                          f"(first custom_id {missing[0]!r})")
    return replace(drawn, outputs=tuple(found.get(o.custom_id, o) if o.custom_id else o for o in drawn.outputs))
