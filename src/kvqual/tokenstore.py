"""Per-token data beside a JSONL results file, in Arrow: `samples.tokens.arrow` next to
`samples.jsonl`, `teacher-by-<run>.tokens.arrow` next to its teacher file.

The JSONL line stays the readable record of an answer (text, lengths, timings, errors); what
is per token (token ids or strings, the scored token's logprob, the top-k alternatives) is a
row here, keyed by (suite, id, repeat). A line whose data lives here says `"token_data": true`
and carries `"logprobs": null`. Why: 256 tokens × top-5 as JSON is ~30 KB per answer, and
parsing it was most of what `kvqual report` spent at 20k items (docs/performance.md).

Format: an Arrow IPC stream, one record batch per row while it is written, each written before
its JSONL line and flushed, so a killed run keeps every row it wrote and a line never points at
a row that is not on disk; a torn last batch is dropped on reading. Closing rewrites the stream
in batches of READ_BATCH rows (reading 20k one-row batches cost more than their data). A file
is never appended to after it was closed: reopening rewrites it (`TokenFile.open`, keeping the
rows its caller still wants), as the samples file is compacted on resume. Token strings of the form `token_id:N` (vLLM's
`return_tokens_as_token_ids`, kvqual serve, SGLang through kvqual's client) are stored as ids
and given back as the same strings. The scored token's logprob is float64; the top-k logprobs
are float32, the precision servers compute them in (vLLM, SGLang and kvqual serve return
float32 values widened to JSON doubles, so nothing is lost on those).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from itertools import chain
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvqual.records import TokenLogprobs

Key = tuple[str, str, int]
SUFFIX = ".tokens.arrow"
READ_BATCH = 4096  # rows per batch once a file is closed
# A one-row batch is too small to gain from the writer's thread pool, and handing it over costs
# ~40 us a row: a third of `write_batch` (the bytes written are the same).
WRITE_OPTIONS = pa.ipc.IpcWriteOptions(use_threads=False)
ID_PREFIX = "token_id:"
WRITE_BUFFER = 1 << 16  # bytes: a row at 256 tokens x top-5 is ~20 KB (a bigger one is written through)

SCHEMA = pa.schema([
    pa.field("suite", pa.string(), nullable=False),
    pa.field("id", pa.string(), nullable=False),
    pa.field("repeat", pa.int32(), nullable=False),
    pa.field("token_ids", pa.list_(pa.int64())),  # the tokens as ids, where the server gave ids
    pa.field("tokens", pa.list_(pa.string())),  # the tokens as strings, where they are not `token_id:N`
    pa.field("tokens_are_ids", pa.bool_()),  # every token string is `token_id:<its id>`
    pa.field("token_logprobs", pa.list_(pa.float64())),  # null entries: a position without a logprob
    pa.field("top_ids", pa.list_(pa.list_(pa.int64()))),  # top-k as ids, where every key is `token_id:N`
    pa.field("top_tokens", pa.list_(pa.list_(pa.string()))),  # else top-k as strings
    pa.field("top_logprobs", pa.list_(pa.list_(pa.float32()))),
    pa.field("text_offset", pa.list_(pa.int64())),
])


def tokens_path(jsonl: Path) -> Path:
    """Where the token data of a JSONL results file lives."""
    return jsonl.with_name(jsonl.name.removesuffix(".jsonl") + SUFFIX)


_ID_STRING = r"^token_id:(0|[1-9][0-9]*)$"  # the form `_strings` writes back: N as an id prints


def _ids_of(strings: pa.Array) -> pa.Array | None:
    """The ids (int64) of strings that are all `token_id:N`, else None. C++ passes over the array
    (a regex match, a slice, a cast), not a Python `int()` per string: this runs for every answer
    received, on 256 tokens and 1,280 top-k names at 256 x top-5. Strings whose first is not an id
    are told at once."""
    if len(strings) == 0:  # made here, not at import: pyarrow's first pa.array imports pandas (~0.3 s)
        return pa.array([], type=pa.int64())
    if not strings[0].as_py().startswith(ID_PREFIX) or not pc.all(pc.match_substring_regex(strings, _ID_STRING)).as_py():
        return None
    return pc.cast(pc.utf8_slice_codeunits(strings, len(ID_PREFIX)), pa.int64())


_CACHE_MAX = 4096  # entries of each cache below: answers come in a few lengths, runs in a few suites
_OFFSETS: dict[tuple[int, int], pa.Array] = {}  # [0, k, 2k, … nk] by (n, k)


def _offsets(tops: tuple, n: int) -> pa.Array:
    lengths = list(map(len, tops))
    if n and len(set(lengths)) == 1:  # every position lists k alternatives (the usual): made once per (n, k)
        k = lengths[0]
        offsets = _OFFSETS.get((n, k))
        if offsets is None:
            offsets = pa.array(np.arange(0, (n + 1) * k, k, dtype=np.int32) if k else np.zeros(n + 1, np.int32))
            if len(_OFFSETS) < _CACHE_MAX:
                _OFFSETS[(n, k)] = offsets
        return offsets
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.fromiter(lengths, dtype=np.int32, count=n), out=offsets[1:])
    return pa.array(offsets)


_ONE_ROW: dict[int, pa.Buffer] = {}  # the [0, n] offsets of a one-row list column, by n


def _one(values: pa.Array | None, typ: pa.DataType) -> pa.Array:
    """A one-row list column holding `values` (a null row when None)."""
    if values is None:
        return pa.nulls(1, typ)
    n = len(values)
    offsets = _ONE_ROW.get(n)
    if offsets is None:
        offsets = pa.py_buffer(np.array([0, n], dtype=np.int32))
        if len(_ONE_ROW) < _CACHE_MAX:
            _ONE_ROW[n] = offsets
    return pa.Array.from_buffers(typ, 1, [None, offsets], children=[values])


_FIELD_TYPES = {f.name: f.type for f in SCHEMA}
_SCALARS: dict[tuple[str, object], pa.Array] = {}  # one-row key and flag columns: a run has a few suites and repeats


def _scalar(name: str, value: object) -> pa.Array:
    array = _SCALARS.get((name, value))
    if array is None:
        array = pa.array([value], type=_FIELD_TYPES[name])
        if len(_SCALARS) < _CACHE_MAX:
            _SCALARS[(name, value)] = array
    return array


def _float32(values: pa.Array) -> pa.Array:
    """float64 to float32 as pyarrow converts a Python float (rounded to nearest; beyond float32's
    range an infinity), nulls kept: numpy's cast where there are none (`pc.cast`'s Python wrapper
    costs twice the cast itself on 1,280 values)."""
    if values.null_count:
        return pc.cast(values, pa.float32(), safe=False)
    with np.errstate(over="ignore"):  # beyond float32's range: an infinity, as pyarrow makes it
        narrow = values.to_numpy(zero_copy_only=True).astype(np.float32)
    return pa.Array.from_buffers(pa.float32(), len(narrow), [None, pa.py_buffer(narrow)])


def row_batch(key: Key, lp: TokenLogprobs) -> pa.RecordBatch:
    """One record as a one-row batch, built from flat arrays with C-level passes (nested Python
    lists through `from_pydict` cost ~2 ms per 256 × top-5 answer; this is the runner's hot path).
    The top-k maps are read where they are (keys chained), never copied; their values are the list
    the finite check chained (`TokenLogprobs.top_values`). The one-row key, flag and offsets columns
    of the usual shapes are made once, not once an answer."""
    typ = _FIELD_TYPES
    tokens = pa.array(lp.tokens, type=pa.string())
    as_ids = _ids_of(tokens)
    token_ids = pa.array(lp.token_ids, type=pa.int64()) if lp.token_ids is not None else as_ids
    tokens_are_ids = as_ids is not None and token_ids is not None and token_ids.equals(as_ids)
    tops = lp.top_logprobs
    names = pa.array(list(chain.from_iterable(tops)), type=pa.string())
    top_ids = _ids_of(names)
    offsets = _offsets(tops, len(tops))
    # float64 and then float32, not float32 from the Python floats: pyarrow converts to float64 at
    # twice the speed, and the cast rounds as that conversion does; a None stays a null (echo)
    scored, flat_lp = pa.array(lp.token_logprobs, type=pa.float64()), pa.array(lp.top_values, type=pa.float64())
    cols = [
        _scalar("suite", key[0]), pa.array([key[1]], type=pa.string()), _scalar("repeat", key[2]),
        _one(token_ids, typ["token_ids"]),
        _one(None if tokens_are_ids else tokens, typ["tokens"]),
        _scalar("tokens_are_ids", tokens_are_ids),
        _one(scored, typ["token_logprobs"]),
        _one(pa.ListArray.from_arrays(offsets, top_ids) if top_ids is not None else None, typ["top_ids"]),
        _one(pa.ListArray.from_arrays(offsets, names) if top_ids is None else None, typ["top_tokens"]),
        _one(pa.ListArray.from_arrays(offsets, _float32(flat_lp)), typ["top_logprobs"]),
        _one(pa.array(lp.text_offset, type=pa.int64()) if lp.text_offset is not None else None, typ["text_offset"]),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=SCHEMA)


def with_key(columns: Iterable[str] | None) -> list[str] | None:
    return None if columns is None else ["suite", "id", "repeat", *[c for c in columns if c not in ("suite", "id", "repeat")]]


def iter_batches(path: Path, columns: Iterable[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The whole batches of a token file in order (a torn last batch dropped), only `columns` (plus
    the key) kept, read one at a time from the file: at most one batch in memory besides what the
    caller keeps. Rows are as written: a key may repeat (the last row wins)."""
    if not (path.is_file() and path.stat().st_size):
        return
    keep = with_key(columns)
    # Mapped, not read: a batch's buffers are the page cache's own pages, where reading copied them
    # into fresh memory the kernel first zeroes (a fifth of the judge's CPU at 20k items went to
    # zeroing pages, a third of that to the reads). Once the caller has had a batch, its pages are
    # dropped from this process (MADV_DONTNEED: the page cache keeps them, and a view still held
    # reads them again), so at most a batch of the file counts in its memory. Writers never
    # truncate a file in place (TokenFile writes a new one and renames it): a mapping stays whole.
    with path.open("rb") as fh:
        try:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return
    source = pa.BufferReader(pa.py_buffer(mapped))
    try:
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, OSError):
        return
    dropped = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except (StopIteration, pa.ArrowInvalid, OSError):  # the end, or a batch torn by a killed writer
            return
        yield batch if keep is None else batch.select(keep)
        upto = source.tell() // mmap.PAGESIZE * mmap.PAGESIZE
        if upto > dropped:
            mapped.madvise(mmap.MADV_DONTNEED, dropped, upto - dropped)
            dropped = upto


def read_table(path: Path, columns: Iterable[str] | None = None) -> pa.Table:
    """Every whole row of a token file (a torn last batch dropped), only `columns` (plus the key)
    read; the last row of a key wins. An empty table when the file does not exist."""
    keep = with_key(columns)
    schema = SCHEMA if keep is None else pa.schema([SCHEMA.field(c) for c in keep])
    return _last_per_key(pa.Table.from_batches(list(iter_batches(path, columns)), schema=schema))


def _last_per_key(table: pa.Table) -> pa.Table:
    if table.num_rows < 2:
        return table
    keys = list(zip(table.column("suite").to_pylist(), table.column("id").to_pylist(), table.column("repeat").to_pylist()))
    last = {k: i for i, k in enumerate(keys)}
    if len(last) == len(keys):
        return table
    return table.take(sorted(last.values()))


def keys_of(table: pa.Table) -> list[Key]:
    return list(zip(table.column("suite").to_pylist(), table.column("id").to_pylist(),
                    table.column("repeat").to_pylist()))


def _strings(ids: list[int]) -> tuple[str, ...]:
    return tuple(f"{ID_PREFIX}{i}" for i in ids)


def logprobs_rows(table: pa.Table, top_k: bool = True) -> dict[Key, TokenLogprobs]:
    """The rows back as TokenLogprobs, exactly as they were written (for the runtime: teacher
    forcing, the echo check; the judge reads the columns as arrays instead). `top_k=False`
    leaves the alternatives out: what forcing a completion needs is its tokens."""
    out: dict[Key, TokenLogprobs] = {}
    names = [n for n in SCHEMA.names if top_k or not n.startswith("top_")]
    cols = {name: table.column(name).to_pylist() for name in names}
    for i, key in enumerate(keys_of(table)):
        ids = cols["token_ids"][i]
        tokens = _strings(ids) if cols["tokens_are_ids"][i] else tuple(cols["tokens"][i] or ())
        tops: tuple = ()
        if top_k:
            top_names = cols["top_ids"][i]
            top_lp = cols["top_logprobs"][i] or []
            keys = [_strings(t) for t in top_names] if top_names is not None else cols["top_tokens"][i] or []
            tops = tuple(dict(zip(n, lp)) for n, lp in zip(keys, top_lp))
        offsets = cols["text_offset"][i]
        out[key] = TokenLogprobs(tokens=tokens, token_logprobs=tuple(cols["token_logprobs"][i] or ()), top_logprobs=tops,
                                 text_offset=tuple(offsets) if offsets is not None else None,
                                 token_ids=tuple(ids) if ids is not None else None)
    return out


def load_logprobs(path: Path, top_k: bool = True) -> dict[Key, TokenLogprobs]:
    columns = None if top_k else [n for n in SCHEMA.names if not n.startswith("top_")]
    return logprobs_rows(read_table(path, columns), top_k)


class TokenFile:
    """The writer of one token file: a row per record, flushed as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # buffered, and flushed after every row: a one-row batch is ~20 writes of its pieces to an
        # unbuffered file (~20 us a row), one write this way; what is on disk after a flush is the same
        self._sink = pa.BufferedOutputStream(pa.OSFile(str(path), "wb"), WRITE_BUFFER)
        self._writer = pa.ipc.new_stream(self._sink, SCHEMA, options=WRITE_OPTIONS)

    @classmethod
    def open(cls, path: Path, keep: Callable[[Key], bool] | None = None) -> "TokenFile":
        """Open `path` for writing, rewriting the rows already there (those `keep` accepts; all
        when None) into a fresh stream first: an Arrow stream is not appended to once closed."""
        old = read_table(path) if path.is_file() else None
        if old is not None and keep is not None and old.num_rows:
            old = old.filter(pa.array([keep(k) for k in keys_of(old)], type=pa.bool_()))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        out = cls(tmp)
        if old is not None and old.num_rows:
            for batch in old.combine_chunks().to_batches(max_chunksize=READ_BATCH):
                out._writer.write_batch(batch)
        out._sink.flush()
        os.replace(tmp, path)
        out.path = path
        return out

    def append(self, key: Key, lp: TokenLogprobs) -> None:
        self._writer.write_batch(row_batch(key, lp))
        self._sink.flush()

    def close(self) -> None:
        """Close the stream, then rewrite it in batches of READ_BATCH rows: a batch per row keeps every
        answer of a killed run, but reading 20k one-row batches costs more than the rows themselves.
        The rewrite goes to a temp file and replaces the stream whole, so an interruption leaves
        the one-row form, still complete."""
        if self._writer is None:
            return
        self._writer.close()
        self._sink.close()
        self._writer = None
        table = read_table(self.path)
        if table.num_rows > 1:
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA, options=WRITE_OPTIONS) as writer:
                for batch in table.combine_chunks().to_batches(max_chunksize=READ_BATCH):
                    writer.write_batch(batch)
            os.replace(tmp, self.path)


def attach(records: dict, stored: Iterable[Key], jsonl: Path, top_k: bool = True) -> None:
    """Give the records of `stored` keys (lines marked `token_data`) their logprobs from the token
    file beside `jsonl`; a record whose row is not there is dropped: the row is written before
    its line, so such a line was never a whole answer (the next pass asks it again)."""
    rows = load_logprobs(tokens_path(jsonl), top_k=top_k)
    for key in stored:
        if key in rows:
            records[key] = dataclasses.replace(records[key], logprobs=rows[key])
        else:
            del records[key]
