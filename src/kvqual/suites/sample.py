"""`kvqual sample`: a stratified, reproducible sample of training prompts from a big file.

Two streaming passes keep memory bounded by the sample, not the file: pass 1 validates
every record and counts records per stratum (the `--by` field); quotas are allocated by
largest remainder, so each stratum gets within one item of its proportional share and the
total is exactly n; pass 2 keeps the records at pre-drawn positions of each stratum.
Inputs: JSONL, JSONL.gz, Parquet; prompts as `prompt`, `messages` or ShareGPT
`conversations`; a trailing assistant turn is dropped so the server answers it.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from kvqual.errors import SuiteError, UsageError
from kvqual.records import Item, dumps_line

__all__ = ["sample_prompts", "normalize_record", "allocate", "add_arguments", "run"]

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "model": "assistant", "chatgpt": "assistant", "bing": "assistant", "system": "system"}
MISSING = "(none)"


def _open_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:  # type: ignore[operator]
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield number, line


def _records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line or row number, parsed record or the JSON error) for every non-blank record."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        row = 0
        for batch in pf.iter_batches(batch_size=4096):
            for record in batch.to_pylist():
                row += 1
                yield row, record
        return
    for number, line in _open_lines(path):
        try:
            yield number, json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            yield number, ValueError(f"invalid JSON: {exc}")


def _messages(turns: Any, *, sharegpt: bool) -> tuple[dict[str, Any], ...]:
    if not isinstance(turns, list) or not turns:
        raise ValueError("messages/conversations must be a non-empty list")
    out = []
    for turn in turns:
        if not isinstance(turn, Mapping):
            raise ValueError("each turn must be an object")
        role = turn.get("from") if sharegpt else turn.get("role")
        content = turn.get("value") if sharegpt else turn.get("content")
        if role not in _ROLES:
            raise ValueError(f"unknown role {role!r}")
        if isinstance(content, list):  # OpenAI content parts: keep the text parts
            texts = [p.get("text") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
            content = "\n".join(t for t in texts if isinstance(t, str)) if texts else None
        if not isinstance(content, str):
            raise ValueError(f"turn with role {role!r} has no text content")
        out.append({"role": _ROLES[role], "content": content})
    while out and out[-1]["role"] == "assistant":
        out.pop()
    if not any(m["role"] == "user" for m in out):
        raise ValueError("no user turn left once the last assistant turn is dropped")
    return tuple(out)


def normalize_record(record: Any, *, suite: str, number: int, by: str | None) -> Item:
    """One dataset record as a suite Item (no answer: compared by distribution)."""
    if isinstance(record, Exception):
        raise record
    if not isinstance(record, Mapping):
        raise ValueError("a record must be a JSON object")
    prompt, messages = None, None
    if isinstance(record.get("prompt"), str) and record["prompt"]:
        prompt = record["prompt"]
    elif record.get("messages") is not None:
        messages = _messages(record["messages"], sharegpt=False)
    elif record.get("conversations") is not None:
        messages = _messages(record["conversations"], sharegpt=True)
    else:
        raise ValueError("no prompt: expected 'prompt', 'messages' or 'conversations'")
    raw_id = record.get("id")
    item_id = str(raw_id) if isinstance(raw_id, (str, int)) and str(raw_id) else f"L{number}"
    return Item(id=item_id, suite=suite, prompt=prompt, messages=messages,
                category=_stratum(record, by) if by else None, meta={"source_line": number})


def _stratum(record: Any, by: str | None) -> str:
    if by is None or not isinstance(record, Mapping):
        return MISSING
    value = record.get(by)
    if value is None:
        return MISSING
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def allocate(counts: Mapping[str, int], n: int) -> dict[str, int]:
    """Exactly n spread over strata in proportion to counts (largest remainder, ties by name)."""
    total = sum(counts.values())
    if n > total:
        raise UsageError(f"asked for {n} prompts but the file has only {total} usable ones")
    keys = sorted(counts)
    shares = {k: n * counts[k] / total for k in keys}
    quota = {k: int(shares[k]) for k in keys}
    left = n - sum(quota.values())
    for k in sorted(keys, key=lambda k: (-(shares[k] - quota[k]), k))[:left]:
        quota[k] += 1
    return quota


def _suite_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json", ".parquet"):
        name = name.removesuffix(suffix)
    return name


def sample_prompts(path: str | os.PathLike[str], *, n: int, by: str | None, seed: int,
                   on_bad: Callable[[int, str], None] | None = None) -> list[Item]:
    """n prompts drawn from `path`, stratified by field `by`, reproducible for one seed.

    A malformed record raises SuiteError naming file:line, unless `on_bad(line, problem)`
    is given, which is then called and the record skipped.
    """
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"{p}: no such file")
    if n < 1:
        raise UsageError(f"--n must be >= 1, got {n}")
    suite = _suite_name(p)
    counts: Counter[str] = Counter()
    fields: set[str] = set()  # of the first records, to name what --by could have been
    with_field = 0
    for number, record in _records(p):  # pass 1: validate and count
        try:
            normalize_record(record, suite=suite, number=number, by=by)
        except ValueError as exc:
            if on_bad is None:
                raise SuiteError(str(p), number, str(exc)) from None
            on_bad(number, str(exc))
            continue
        counts[_stratum(record, by)] += 1
        with_field += by is not None and by in record
        if by is not None and not with_field and len(fields) < 200:
            fields.update(str(k) for k in record)
    if by is not None and counts and not with_field:
        raise UsageError(f"--by {by}: no record in {p} has a field {by!r} "
                         f"(fields: {', '.join(sorted(fields)[:20])})")
    quota = allocate(counts, n)
    rng = random.Random(f"kvqual-sample:{seed}")
    chosen = {k: set(rng.sample(range(counts[k]), quota[k])) for k in sorted(counts)}
    seen: Counter[str] = Counter()
    items: list[Item] = []
    for number, record in _records(p):  # pass 2: keep the chosen positions
        try:
            item = normalize_record(record, suite=suite, number=number, by=by)
        except ValueError:
            continue
        key = _stratum(record, by)
        if seen[key] in chosen[key]:
            items.append(item)
        seen[key] += 1
    return _unique_ids(items)


def _unique_ids(items: list[Item]) -> list[Item]:
    """Dataset ids may repeat; suffix repeats with their source line so ids stay unique."""
    from dataclasses import replace

    ids = Counter(item.id for item in items)
    return [replace(it, id=f"{it.id}-L{it.meta['source_line']}") if ids[it.id] > 1 else it
            for it in items]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `kvqual sample DATASET --n N [--by FIELD] [--seed S] -o OUT.jsonl`."""
    parser.add_argument("dataset", help="JSONL, JSONL.gz or Parquet file of prompts")
    parser.add_argument("--n", type=int, required=True, help="exact number of prompts")
    parser.add_argument("--by", metavar="FIELD", help="stratify by this field (e.g. category)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.jsonl")
    parser.add_argument("--force", action="store_true", help="overwrite an existing output")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip malformed records (each reported on stderr) instead of stopping")
    parser.add_argument("--max-tokens", type=int, metavar="N",
                        help="give every prompt max_tokens N (long-generation drift: thousands on a GPU "
                             "server); default: the record's own, else the run's")


def run(args: argparse.Namespace) -> int:
    """Run `kvqual sample`; errors are raised as KvqualError for the CLI to map."""
    out = Path(args.output)
    if out.exists() and not args.force:
        raise UsageError(f"{out} exists; pass --force to overwrite it")
    bad: list[int] = []

    def report(number: int, problem: str) -> None:
        bad.append(number)
        print(f"{args.dataset}:{number}: skipped: {problem}", file=sys.stderr)

    if args.max_tokens is not None and args.max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1 (got {args.max_tokens})")
    items = sample_prompts(args.dataset, n=args.n, by=args.by, seed=args.seed,
                           on_bad=report if args.skip_bad else None)
    if args.max_tokens is not None:
        from dataclasses import replace

        items = [replace(item, max_tokens=args.max_tokens) for item in items]
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for item in items:
            f.write(dumps_line(item.to_json()))
    os.replace(tmp, out)
    by_cat = Counter(item.category for item in items)
    detail = ", ".join(f"{k}: {v}" for k, v in sorted(by_cat.items())) if args.by else ""
    print(f"wrote {len(items)} prompts to {out}" + (f" ({detail})" if detail else "")
          + (f"; skipped {len(bad)} malformed records" if bad else ""))
    return 0
