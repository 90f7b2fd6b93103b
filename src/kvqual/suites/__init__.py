"""Suites: what kvqual sends. A suite spec is one of

    path/to/file.jsonl        a user suite (the JSONL contract in the brief)
    builtin:NAME | NAME       a built-in generated suite (`kvqual suites` lists them);
                              `builtin:NAME[CAT,...]@N`: its first N items of those categories
    profile:NAME              a documented mix of built-ins ("default", "thorough")
    lm-eval:TASK[,TASK...]    lm-evaluation-harness tasks, run through lm-eval itself
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from kvqual.errors import SuiteError, UsageError
from kvqual.records import Item, SuiteRef, dumps_line

__all__ = ["LoadedSuite", "load_suites", "resolve_specs", "suite_hash"]


@dataclass(frozen=True)
class LoadedSuite:
    """A suite ready to run: its reference (name, source, content hash) and items.

    lm-eval suites carry no items: lm-eval builds its own requests (`lmeval_tasks`).
    """

    ref: SuiteRef
    items: tuple[Item, ...] = ()
    lmeval_tasks: tuple[str, ...] = ()
    include_path: str | None = None


def suite_hash(items: list[Item] | tuple[Item, ...]) -> str:
    """sha256 over the canonical JSON of the items, in order."""
    h = hashlib.sha256()
    for item in items:
        h.update(dumps_line({"suite": item.suite, **item.to_json()}).encode())
    return h.hexdigest()


def _finish(name: str, source: str, items: list[Item], limit: int | None) -> LoadedSuite:
    if limit is not None:
        items = items[:limit]
    return LoadedSuite(SuiteRef(name, source, suite_hash(items), len(items)), tuple(items))


def resolve_specs(specs: list[str] | tuple[str, ...]) -> list[str]:
    """Expand `profile:NAME` into its built-in suites (each `builtin:NAME[CATS]@N`)."""
    out: list[str] = []
    for spec in specs:
        if spec.startswith("profile:"):
            from kvqual.suites import generated

            name = spec.removeprefix("profile:")
            if name not in generated.PROFILES:
                raise SuiteError(spec, None, f"unknown profile (known: {', '.join(generated.PROFILES)})")
            out.extend(generated.entry_spec(entry) for entry in generated.PROFILES[name])
        else:
            out.append(spec)
    return out


def load_suite(spec: str, *, seed: int, limit: int | None, include_path: str | None = None) -> LoadedSuite:
    """One spec → a LoadedSuite (limit = at most this many items, the first ones)."""
    if spec.startswith("lm-eval:"):
        tasks = tuple(t for t in spec.removeprefix("lm-eval:").split(",") if t)
        if not tasks:
            raise SuiteError(spec, None, "no lm-eval task named (lm-eval:TASK[,TASK...])")
        source = json.dumps({"tasks": tasks, "include_path": include_path, "limit": limit})
        digest = hashlib.sha256(source.encode()).hexdigest()
        return LoadedSuite(SuiteRef(spec, source, digest, 0), lmeval_tasks=tasks, include_path=include_path)
    path = Path(spec)
    if spec.endswith((".jsonl", ".jsonl.gz")) or path.exists():
        from kvqual.suites.jsonl import load_jsonl_suite

        return _finish(path.name.removesuffix(".gz").removesuffix(".jsonl"), str(path),
                       load_jsonl_suite(path), limit)
    from kvqual.suites import generated

    name, _, size = spec.removeprefix("builtin:").partition("@")
    categories: tuple[str, ...] = ()
    if name.endswith("]") and "[" in name:
        name, _, cats = name[:-1].partition("[")
        categories = tuple(c.strip() for c in cats.split(",") if c.strip())
    if name not in generated.BUILTIN_SUITES:
        raise SuiteError(spec, None, f"no such file or built-in suite (built-ins: {', '.join(generated.BUILTIN_SUITES)})")
    if size and not size.isdigit():
        raise SuiteError(spec, None, f"the item count after '@' must be a whole number, got {size!r}")
    n = int(size) if size else None
    if limit is not None:
        n = min(n, limit) if n is not None else limit
    try:
        items = generated.generate(name, seed=seed, limit=n, categories=categories)
    except UsageError as exc:
        raise SuiteError(spec, None, str(exc)) from None
    where = f"[{','.join(categories)}]" if categories else ""
    return _finish(name, f"builtin:{name}{where}?seed={seed}", items, None)


def load_suites(specs: list[str] | tuple[str, ...], *, seed: int, limit: int | None,
                include_path: str | None = None) -> list[LoadedSuite]:
    """Load every spec; suite names must be unique within a run."""
    loaded = [load_suite(s, seed=seed, limit=limit, include_path=include_path) for s in resolve_specs(specs)]
    names: dict[str, str] = {}
    for suite in loaded:
        if suite.ref.name in names:
            raise SuiteError(suite.ref.source, None,
                             f"suite name {suite.ref.name!r} also used by {names[suite.ref.name]}; rename one file")
        names[suite.ref.name] = suite.ref.source
    return loaded
