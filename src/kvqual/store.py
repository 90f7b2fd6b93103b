"""The results store: `results/<run-id>/manifest.json` + `samples.jsonl`, resumable.

samples.jsonl is append-only. Answers are written in groups: up to FLUSH_ROWS of them, none held
longer than FLUSH_SECONDS (the runner flushes the store that often while it waits), each group's token
rows as one Arrow batch, flushed, and then its lines, flushed: a line on disk always has its row.
A run killed at any point keeps every answer of the groups written, and loses at most the last
second's answers (asked again on resume); one stopped by Ctrl-C or SIGTERM, or ending, writes all.
Why groups: building and writing a batch a row cost the runner a quarter of its client CPU per
request at 256 tokens x top-5 (docs/performance.md). On resume the file is compacted once (atomically): successful
samples are kept, a torn last line is dropped, and failed samples are moved to
`retried.jsonl` so their items are asked again — each key then appears exactly once.
The manifest is replaced atomically (temp file + rename).

One writer per run folder: `RunStore` holds an advisory lock (`fcntl.flock` on `.lock`, which
also records the holder's pid) for as long as it is open. The kernel frees it when the holder
exits, however it ends, so a killed run never leaves a stale lock; a second process that opens
the folder is refused (exit 2) before it touches the samples.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Literal, Mapping

import orjson

from kvqual import tokenstore
from kvqual.errors import KvqualError, UsageError
from kvqual.records import RunManifest, Sample, dumps_line, refused_limit

MANIFEST = "manifest.json"
SAMPLES = "samples.jsonl"
RETRIED = "retried.jsonl"
LOCK = ".lock"
TOKEN_DATA = "token_data"  # a samples.jsonl line whose logprobs are a row of samples.tokens.arrow (tokenstore.py)

Key = tuple[str, str, int]
FLUSH_ROWS = 64  # answers written together at most
FLUSH_SECONDS = 1.0  # the longest an answer waits to be written


def run_key(identity: Mapping[str, Any]) -> str:
    """Content hash that finds a run folder again from what defines the run."""
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, ensure_ascii=False, default=str)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


_BIG = float(2**63)


def _no_big_floats(obj: Any) -> bool:
    """No float in `obj` (a decoded line) as large as 2**63: where orjson met an integer beyond 64
    bits it gives a float that large instead of refusing the number."""
    if type(obj) is float:
        return -_BIG < obj < _BIG
    stack = [obj] if type(obj) in (dict, list) else []
    while stack:
        o = stack.pop()
        for v in (o.values() if type(o) is dict else o):
            t = type(v)
            if t is float:
                if not -_BIG < v < _BIG:
                    return False
            elif t is dict or t is list:
                stack.append(v)
    return True


def decode_line(raw: bytes) -> Any:
    """One JSONL line (bytes) as `json.loads` of its UTF-8 text (invalid bytes replaced) reads it;
    `json.JSONDecodeError` where that fails. orjson first (~4x faster on a samples line; a judge at
    20k items reads 45k of them): it is strict JSON and exact, and what it refuses (NaN or
    Infinity, which Python's encoder writes; a lone surrogate escape; invalid UTF-8; a torn line)
    goes through the standard decoder, as does a line where it read a float of 2**63 or more (an
    integer beyond 64 bits, which orjson reads as a float: the standard decoder keeps it an int),
    so what is accepted, and how, is the standard decoder's."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        if _no_big_floats(obj):
            return obj
    return json.loads(raw.decode("utf-8", errors="replace"))


def iter_sample_lines(path: Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, decoded object or None for a torn/undecodable line)."""
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = decode_line(raw)
            except json.JSONDecodeError:
                yield lineno, None
                continue
            yield lineno, obj if isinstance(obj, dict) else None


def sample_line(sample: Sample) -> str:
    """The samples.jsonl line of a sample whose logprobs go to the token file."""
    if sample.logprobs is None:
        return dumps_line(sample.to_json())
    return dumps_line({**sample.to_json(logprobs=False), TOKEN_DATA: True})


def load_samples(run_dir: str | Path, logprobs: Literal["all", "tokens", "inline"] = "all") -> dict[Key, Sample]:
    """Every sample of a run by key; a later line for a key replaces an earlier one. `logprobs`:
    what of the token file to attach ("tokens": the tokens and their logprobs without the top-k
    alternatives; "inline": nothing, for the judge, which reads the token file as arrays: only
    lines from before the token files keep the logprobs they carry). Runs written before the
    token file (logprobs inline in the JSONL) read the same."""
    path = Path(run_dir) / SAMPLES
    if not path.is_file():
        raise KvqualError(f"{run_dir}: not a kvqual run folder (no {SAMPLES})")
    out: dict[Key, Sample] = {}
    stored: set[Key] = set()
    for lineno, obj in iter_sample_lines(path):
        if obj is None:
            continue  # torn line from a killed run; the item was not answered
        try:
            sample = Sample.from_json(obj)
        except (TypeError, KeyError) as exc:
            raise KvqualError(f"{path}:{lineno}: not a kvqual sample: {exc}") from None
        out[sample.key] = sample
        if obj.get(TOKEN_DATA):
            stored.add(sample.key)
        else:
            stored.discard(sample.key)
    if stored and logprobs != "inline":
        tokenstore.attach(out, stored, path, top_k=logprobs == "all")
    return out


def answered_keys(run_dir: str | Path) -> set[Key]:
    """Keys of the successful samples on disk (keys only: constant memory per sample)."""
    path = Path(run_dir) / SAMPLES
    if not path.is_file():
        return set()
    return {(obj.get("suite"), obj.get("id"), obj.get("repeat"))  # type: ignore[misc]
            for _, obj in iter_sample_lines(path) if obj is not None and obj.get("error") is None}


def error_kind(message: str) -> str:
    """A failure's kind for counting: `HTTP 500`, `timeout`, `connection error`, ..."""
    if message.startswith("HTTP "):
        return " ".join(message.split(":", 1)[0].split()[:2])
    return message.split(":", 1)[0][:60]


def last_errors(run_dir: str | Path) -> list[str]:
    """The failure of every key still unanswered in a run folder (its last line's error)."""
    path = Path(run_dir) / SAMPLES
    if not path.is_file():
        return []
    last: dict[Key, str | None] = {}
    for _, obj in iter_sample_lines(path):
        if obj is not None:
            last[(obj.get("suite"), obj.get("id"), obj.get("repeat"))] = obj.get("error")  # type: ignore[index]
    return [str(e) for e in last.values() if e is not None]


def failure_counts(run_dir: str | Path) -> Counter[str]:
    """How often each kind of failure is recorded for the keys still unanswered in a run folder."""
    return Counter(error_kind(e) for e in last_errors(run_dir))


def failure_summary(run_dir: str | Path) -> str:
    """`HTTP 500 ×3, timeout ×1`: `failure_counts` in words, most frequent first (ties by name)."""
    counts = sorted(failure_counts(run_dir).items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{kind} ×{n}" for kind, n in counts) or "no error recorded"


class RunLock:
    """The advisory lock of one run folder (`fcntl.flock` on `<run>/.lock`): one writer at a time.

    Held until `release()` or the holder's exit (the kernel frees it however the process ends);
    the file keeps the holder's pid so a refused process can say who holds it.
    """

    def __init__(self, run_dir: Path, fd: int) -> None:
        self.run_dir, self._fd = run_dir, fd

    @classmethod
    def acquire(cls, run_dir: str | Path) -> "RunLock":
        """Lock `run_dir` (created if missing), or raise UsageError (exit 2) naming the holder."""
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            holder = f" (pid {pid})" if pid.isdigit() else ""
            raise UsageError(f"{run_dir}: another kvqual process{holder} is writing this run folder; "
                             "wait for it to finish, or pass --out for another results folder") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(run_dir, fd)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def load_manifest(run_dir: str | Path) -> RunManifest:
    """A run folder's manifest; one left at "running" by a writer that is gone is marked interrupted
    first (`_interrupted`)."""
    path = Path(run_dir) / MANIFEST
    try:
        manifest = RunManifest.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise KvqualError(f"{run_dir}: not a kvqual run folder (no {MANIFEST})") from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise KvqualError(f"{path}: unreadable manifest: {exc}") from None
    return _interrupted(Path(run_dir), manifest) if manifest.status == "running" else manifest


def _interrupted(run_dir: Path, manifest: RunManifest) -> RunManifest:
    """A manifest still "running" whose writer is gone (killed with -9: the kernel freed its lock, so
    the lock is free now) is "incomplete", with what is on disk counted (`interrupted`: 1) and written
    back (in memory only where the folder is read-only). While a writer holds the lock — another
    process, or this one resuming the run — it is left as it is."""
    try:
        lock: RunLock | None = RunLock.acquire(run_dir)
    except UsageError:
        return manifest
    except OSError:
        lock = None
    try:
        last: dict[Key, Any] = {}
        for _, obj in iter_sample_lines(run_dir / SAMPLES) if (run_dir / SAMPLES).is_file() else ():
            if obj is not None:
                last[(obj.get("suite"), obj.get("id"), obj.get("repeat"))] = obj.get("error")  # type: ignore[index]
        unfit = sum(1 for e in last.values() if e is not None and refused_limit(e) is not None)
        ok = sum(1 for e in last.values() if e is None)
        counts = {**manifest.counts, "units": len(last), "ok": ok, "failed": len(last) - ok - unfit,
                  "does_not_fit": unfit, "interrupted": 1}
        manifest = replace(manifest, status="incomplete", counts=counts)
        if lock is not None:
            try:
                write_json_atomic(run_dir / MANIFEST, manifest.to_json())
            except OSError:
                pass  # a read-only results folder: the corrected manifest is this command's alone
    finally:
        if lock is not None:
            lock.release()
    return manifest


class RunStore:
    """Append-only writer for one run folder; reopens an existing run to resume it."""

    def __init__(self, run_dir: Path, manifest: RunManifest, lock: RunLock | None = None) -> None:
        self.run_dir = run_dir
        self.manifest = manifest
        self.done: set[Key] = set()  # keys answered for good (keys only: constant memory per sample)
        self.unfit: set[Key] = set()  # of those, prompts the server refused as longer than its context
        self._fh = None
        self._tokens: tokenstore.TokenFile | None = None
        self._lock = lock
        self._pending: list[Sample] = []  # answers taken, not yet written (`flush`)
        self._since = 0.0  # when the first of them was taken (time.monotonic)

    @classmethod
    def open(cls, results_dir: str | Path, manifest: RunManifest, *, rerun: bool = False,
             lock: RunLock | None = None) -> "RunStore":
        """Create `results_dir/<run_id>`, or resume it, holding its lock until `close()` (`lock`: one
        the caller already holds on that folder; the store takes it over). `rerun` keeps the old
        folder as a backup. Another process writing the folder: UsageError (exit 2)."""
        run_dir = Path(results_dir) / manifest.run_id
        lock = lock or RunLock.acquire(run_dir)
        try:
            if rerun and any(p.name != LOCK for p in run_dir.iterdir()):
                backup = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
                shutil.move(str(run_dir), str(backup))  # a rename: the lock moves with it, still held
                old, lock = lock, RunLock.acquire(run_dir)
                old.release()
            store = cls(run_dir, manifest, lock)
            samples = run_dir / SAMPLES
            if samples.exists():
                previous = _previous_manifest(run_dir)
                if previous is not None:
                    store.manifest = _resumed(manifest, previous)
                store._compact(samples)
            done = store.done
            store._tokens = tokenstore.TokenFile.open(tokenstore.tokens_path(samples), keep=lambda k: k in done)
            store._fh = samples.open("a", encoding="utf-8")
            store.write_manifest()
        except BaseException:
            lock.release()
            raise
        return store

    def _compact(self, samples: Path) -> None:
        kept: dict[Key, str] = {}
        failed: list[str] = []
        rows = set(tokenstore.keys_of(tokenstore.read_table(tokenstore.tokens_path(samples), ["suite", "id", "repeat"])))
        for _, obj in iter_sample_lines(samples):
            if obj is None:
                continue
            if obj.get(TOKEN_DATA) and (obj.get("suite"), obj.get("id"), obj.get("repeat")) not in rows:
                continue  # its token row was never written: not an answer
            line = dumps_line(obj)
            key = (obj.get("suite"), obj.get("id"), obj.get("repeat"))
            if obj.get("error") is None or refused_limit(obj.get("error")) is not None:
                kept[key] = line  # type: ignore[index]  # an answer, or a prompt refused as too long: final
                if obj.get("error") is not None:
                    self.unfit.add(key)  # type: ignore[arg-type]
            else:
                failed.append(line)
        tmp = samples.with_name(f".{SAMPLES}.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            fh.writelines(kept.values())
            fh.flush()
            os.fsync(fh.fileno())
        if failed:
            with (self.run_dir / RETRIED).open("a", encoding="utf-8") as fh:
                fh.writelines(failed)
        os.replace(tmp, samples)
        self.done = set(kept)

    def append(self, sample: Sample) -> None:
        """Take an answer; it is on disk by the next `flush`: at FLUSH_ROWS answers, on the next
        answer once it is FLUSH_SECONDS old, by the runner's flush every FLUSH_SECONDS, or on close."""
        assert self._fh is not None and self._tokens is not None
        if not self._pending:
            self._since = time.monotonic()
        self._pending.append(sample)
        if sample.ok or sample.does_not_fit:  # a prompt refused as too long would be refused again
            self.done.add(sample.key)
            if not sample.ok:
                self.unfit.add(sample.key)
        if len(self._pending) >= FLUSH_ROWS or time.monotonic() - self._since >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        """The waiting answers to disk: their token rows first (one batch), then their lines."""
        assert self._fh is not None and self._tokens is not None
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        self._tokens.append_rows([(s.key, s.logprobs) for s in pending if s.logprobs is not None])
        self._fh.write("".join(map(sample_line, pending)))
        self._fh.flush()

    def write_manifest(self) -> None:
        write_json_atomic(self.run_dir / MANIFEST, self.manifest.to_json())

    def close(self) -> None:
        """Write what waits, close the files and free the run folder for the next writer."""
        try:
            if self._fh is not None:
                self.flush()
        finally:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            if self._tokens is not None:
                self._tokens.close()
                self._tokens = None
            if self._lock is not None:
                self._lock.release()
                self._lock = None


def _previous_manifest(run_dir: Path) -> RunManifest | None:
    try:
        return load_manifest(run_dir)
    except KvqualError:
        return None


CARRIED_COUNTS = ("retries", "reconnects")  # summed over every session of a run


def _resumed(new: RunManifest, old: RunManifest) -> RunManifest:
    """Keep the original start time and the retries and reconnects so far; count the resume."""
    resumes = int(old.counts.get("resumes", 0)) + 1
    carried = {k: int(old.counts.get(k, 0)) for k in CARRIED_COUNTS}
    return replace(new, started_at=old.started_at, counts={**new.counts, **carried, "resumes": resumes})
