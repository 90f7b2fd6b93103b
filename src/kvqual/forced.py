"""The teacher-forcing files beside a baseline run: their names, their records, their writer and
their reader — what forcing (forcing/) writes and the judge (judge/) reads, so neither imports
the other.

For each scoring server: `teacher-by-<run>.jsonl` (+ its token file; `-again` for the A/A pass),
`teacher-window-by-<run>.json` (the prompt limit its windows were planned against: the smallest
any server of the comparison reports, so both arms score the same windows; docs/longgen.md) and,
when its echo failed the trust check, `teacher-refused-by-<run>.json` (no later round forces it
again, and `kvqual report` says so offline).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping

from kvqual import tokenstore
from kvqual.errors import UsageError
from kvqual.records import TokenLogprobs, dumps_line
from kvqual.store import TOKEN_DATA, decode_line


FAILED = "teacher-forcing request failed"  # a Forced with this reason is retried by the next pass



@dataclass(frozen=True)
class Forced:
    """One teacher-forced item: the completion's tokens as the scoring server saw them."""

    suite: str
    id: str
    repeat: int
    aligned: bool
    reason: str | None
    logprobs: TokenLogprobs | None  # completion positions only
    method: str | None = None  # "ids" (exact token ids) or "text" (text alignment); None: not scored
    # chunked forcing: {"max_prompt": tokens one scoring request held, "windows": [[a, s, e], ...]}
    # (chunk_windows); None when the completion was scored in one request
    chunks: Mapping[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"suite": self.suite, "id": self.id, "repeat": self.repeat, "aligned": self.aligned,
               "reason": self.reason, "method": self.method,
               "logprobs": self.logprobs.to_json() if self.logprobs else None}
        if self.chunks is not None:  # only where chunked: unchunked records keep their bytes
            out["chunks"] = {"max_prompt": self.chunks["max_prompt"],
                             "windows": [list(w) for w in self.chunks["windows"]]}
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Forced":
        lp = TokenLogprobs.from_json(d["logprobs"]) if d.get("logprobs") else None
        method = d.get("method", "text" if lp is not None else None)  # files from before ids were text
        chunks = d.get("chunks")
        return cls(d["suite"], d["id"], d["repeat"], d["aligned"], d.get("reason"), lp, method,
                   chunks if isinstance(chunks, Mapping) else None)



@contextlib.contextmanager
def one_writer(out: Path) -> Iterator[None]:
    """An advisory lock on `out` (`<out>.lock`, freed when the process dies): two compares that reuse
    one baseline never append to the same teacher-forcing file at once; the second is refused."""
    fd = os.open(out.with_name(out.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"{out}: another kvqual process is teacher-forcing into this file; wait for it "
                             "to finish") from None
        yield
    finally:
        os.close(fd)  # closing the descriptor frees the lock



class ForcedWriter:
    """Appends Forced records to a teacher file: the logprobs as a row of its token file
    (tokenstore.py), written first, then the line, flushed. Opening rewrites the token file with
    the rows of `keep` (an Arrow stream is not appended to once closed)."""

    def __init__(self, path: Path, keep: Mapping[tuple[str, str, int], Forced] | None = None) -> None:
        self.path, self.keep = path, keep

    def __enter__(self) -> "ForcedWriter":
        keep = self.keep
        self._tokens = tokenstore.TokenFile.open(tokenstore.tokens_path(self.path),
                                                 None if keep is None else (lambda k: k in keep))
        self._fh = _append_lines(self.path)
        return self

    def write(self, f: Forced) -> None:
        line = f.to_json()
        if f.logprobs is not None:
            self._tokens.append((f.suite, f.id, f.repeat), f.logprobs)
            line = {**line, "logprobs": None, TOKEN_DATA: True}
        self._fh.write(dumps_line(line))
        self._fh.flush()

    def __exit__(self, *exc: object) -> None:
        self._fh.close()
        self._tokens.close()



def _append_lines(path: Path) -> IO[str]:
    """`path` opened for appending JSONL; a torn last line (an interrupted pass) is ended first, so
    the next line is not glued to it (load_forced skips the torn one)."""
    if path.is_file() and path.stat().st_size:
        with path.open("rb") as fh:
            fh.seek(-1, 2)
            torn = fh.read(1) != b"\n"
        if torn:
            with path.open("a", encoding="utf-8") as fh:
                fh.write("\n")
    return path.open("a", encoding="utf-8")



def save_forced(path: Path, forced: Iterable[Forced]) -> None:
    """Append teacher-forced records to a teacher file (what a forcing pass writes as it goes)."""
    with ForcedWriter(path) as writer:
        for f in forced:
            writer.write(f)



def load_forced(path: Path, logprobs: bool = True) -> dict[tuple[str, str, int], Forced]:
    """Forced items by key; a torn last line (an interrupted pass) is skipped and forced again,
    as is a line whose token row is not on disk. `logprobs=False`: the records without what the
    token file holds (the judge reads it as arrays; lines from before the token files keep the
    logprobs they carry inline). Files from before the token file read the same."""
    if not path.is_file():
        return {}
    out: dict[tuple[str, str, int], Forced] = {}
    stored: set[tuple[str, str, int]] = set()
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            obj = decode_line(line)
            f = Forced.from_json(obj)
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            continue
        key = (f.suite, f.id, f.repeat)
        out[key] = f
        (stored.add if obj.get(TOKEN_DATA) else stored.discard)(key)
    if stored and logprobs:
        tokenstore.attach(out, stored, path)
    return out


def teacher_file(base_dir: Path, scorer_run_id: str, again: bool = False) -> Path:
    return base_dir / f"teacher-by-{scorer_run_id}{'-again' if again else ''}.jsonl"



def window_file(base_dir: Path, scorer_run_id: str) -> Path:
    """Where a compare records the prompt limit a scoring server's windows were planned against
    (`TeacherForcer.limit_to`; docs/longgen.md), so the report says it, offline too."""
    return base_dir / f"teacher-window-by-{scorer_run_id}.json"



def window_limit_of(base_dir: Path, scorer_run_id: str) -> tuple[bool, int | None]:
    """(recorded?, the limit): a run forced before kvqual recorded it has no file."""
    try:
        return True, json.loads(window_file(base_dir, scorer_run_id).read_text(encoding="utf-8"))["max_prompt"]
    except (OSError, ValueError, KeyError, TypeError):
        return False, None



COST_KEYS = ("requests", "retried", "reconnects")
CACHE_KEYS = ("scored", "missed")  # tokens scored through the KV cache, and those whose prefix was recomputed


def forcing_cost(base_dir: Path, scorer_run_id: str) -> dict[str, int] | None:
    """What teacher forcing on one scoring server has cost so far, every round and pass together:
    requests sent, attempts after a failure, reconnects (beside the window limit, `window_file`);
    None when not recorded (forced before kvqual recorded it)."""
    try:
        cost = json.loads(window_file(base_dir, scorer_run_id).read_text(encoding="utf-8"))["cost"]
        return {k: int(cost.get(k, 0)) for k in COST_KEYS}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def refusal_file(base_dir: Path, scorer_run_id: str) -> Path:
    """Where a compare records that a server's echo failed the trust check (so no round forces it
    again, and `kvqual report` says the same thing offline)."""
    return base_dir / f"teacher-refused-by-{scorer_run_id}.json"



def refusal(base_dir: Path, scorer_run_id: str) -> dict[str, Any] | None:
    try:
        return json.loads(refusal_file(base_dir, scorer_run_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def through_cache(base_dir: Path, scorer_run_id: str) -> dict[str, int] | None:
    """How one scoring server's teacher forcing read the KV cache, every round and pass together (SGLang's
    steps, forcing/sglang.py): {"step": tokens a request, "scored": tokens scored so, "missed": those of them
    whose step found its prefix recomputed, not cached}; None where it scored in one request an item."""
    try:
        got = json.loads(window_file(base_dir, scorer_run_id).read_text(encoding="utf-8"))["through_cache"]
        return {k: int(got[k]) for k in ("step", *CACHE_KEYS)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
