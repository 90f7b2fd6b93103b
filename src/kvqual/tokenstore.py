"""Per-token data beside a JSONL results file, in Arrow: `samples.tokens.arrow` next to
`samples.jsonl`, `teacher-by-<run>.tokens.arrow` next to its teacher file.

The JSONL line stays the readable record of an answer (text, lengths, timings, errors); what
is per token (token ids or strings, the scored token's logprob, the top-k alternatives) is a
row here, keyed by (suite, id, repeat). A line whose data lives here says `"token_data": true`
and carries `"logprobs": null`. Why: 256 tokens × top-5 as JSON is ~30 KB per answer, and
parsing it was most of what `kvqual report` spent at 20k items (docs/performance.md).

Format: an Arrow IPC stream of record batches, each written before the JSONL lines of its rows
and flushed, so a killed writer keeps every row it wrote and a line never points at a row that is
not on disk; a torn last batch is dropped on reading. The runner writes a batch per group of
answers (RunStore: up to 64 answers, none held over a second), teacher forcing a batch per row.
Closing rewrites a stream of small batches (fewer than MIN_BATCH_ROWS rows on average) in batches
of READ_BATCH rows (reading 20k one-row batches cost more than their data); batches of 16 rows or
more are kept as written (rewriting them cost the runner a seventh of its client CPU per request).
A file is never appended to after it was closed: reopening rewrites it (`TokenFile.open`, keeping
the rows its caller still wants), as the samples file is compacted on resume. Token strings of the form `token_id:N` (vLLM's
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
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kvqual.records import TokenLogprobs

Key = tuple[str, str, int]
SUFFIX = ".tokens.arrow"
READ_BATCH = 4096  # rows per batch once a file of small batches is closed
MIN_BATCH_ROWS = 16  # rows a batch on average, below which closing a file rewrites it in READ_BATCH rows
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
_FIELD_TYPES = {f.name: f.type for f in SCHEMA}
Row = tuple[Key, TokenLogprobs]


def _offsets_of(lengths: np.ndarray) -> np.ndarray:
    """[0, l0, l0 + l1, …] as int32: the offsets of a list column."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] >= 2**31:
        raise ValueError(f"{offsets[-1]} values in one token batch: more than an Arrow list holds")
    return offsets.astype(np.int32)


def _lengths(seqs: Iterable) -> np.ndarray:
    return np.fromiter(map(len, seqs), dtype=np.int64)


def all_per_segment(flags: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """For each segment of `flags` (the next `lengths[i]` of them), whether every flag is set (an
    empty segment: True). Also the judge's per-pair test (judge/positions.py)."""
    misses = np.zeros(len(flags) + 1, dtype=np.int64)
    np.cumsum(~flags, out=misses[1:])
    ends = np.cumsum(lengths)
    return misses[ends] == misses[ends - lengths]


def _id_rows(strings: pa.Array, offsets: np.ndarray, firsts: Iterable[str | None]) -> np.ndarray:
    """Per row of `strings` (rows by `offsets`; `firsts`: each row's first string, None for an empty
    row), whether every string of it is `token_id:N`. One regex pass over the batch, and none when
    no row's first string starts with the prefix (text tokens, the usual case where they are not
    ids). An empty row counts as ids: it reads back the same."""
    lengths = np.diff(offsets)
    if not any(f.startswith(ID_PREFIX) for f in firsts if f is not None):
        return lengths == 0
    return all_per_segment(pc.match_substring_regex(strings, _ID_STRING).to_numpy(zero_copy_only=False), lengths)


def _ids(strings: pa.Array) -> pa.Array:
    """`token_id:N` strings (each one checked by `_id_rows`) as their ids."""
    return pc.cast(pc.utf8_slice_codeunits(strings, len(ID_PREFIX)), pa.int64())


def _kept(values: pa.Array, offsets: np.ndarray, rows: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The values of the rows `rows` marks (rows by `offsets`), and every row's length: 0 where not kept."""
    lengths = np.diff(offsets)
    if rows.all():
        return values, lengths
    return values.filter(pa.array(np.repeat(rows, lengths))), np.where(rows, lengths, 0)


def _list(values: pa.Array, lengths: np.ndarray, typ: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
    """A list column: row i holds the next `lengths[i]` of `values`, or is null where `valid` is False."""
    if valid is not None and not valid.any():
        return pa.nulls(len(lengths), typ)
    mask = None if valid is None or valid.all() else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(_offsets_of(lengths)), values, type=typ, mask=mask)


def _float32(values: pa.Array) -> pa.Array:
    """float64 to float32 as pyarrow converts a Python float (rounded to nearest; beyond float32's
    range an infinity), nulls kept: numpy's cast where there are none (`pc.cast`'s Python wrapper
    costs twice the cast itself on 1,280 values)."""
    if values.null_count:
        return pc.cast(values, pa.float32(), safe=False)
    with np.errstate(over="ignore"):  # beyond float32's range: an infinity, as pyarrow makes it
        narrow = values.to_numpy(zero_copy_only=True).astype(np.float32)
    return pa.Array.from_buffers(pa.float32(), len(narrow), [None, pa.py_buffer(narrow)])


def rows_batch(rows: Sequence[Row]) -> pa.RecordBatch:
    """Records as one batch, built from flat arrays over all its rows in C-level passes: one
    `pa.array` a column for the whole batch, not one an answer (nested Python lists through
    `from_pydict` cost ~2 ms per 256 × top-5 answer; a row at a time ~140 us an answer, a batch
    of 64 ~100 us a row; this is the runner's hot path, docs/performance.md). The top-k maps are read
    where they are (keys chained), never copied; their values are the lists the finite check
    chained (`TokenLogprobs.top_values`). Rows whose token ids came with the answer and rows whose
    ids are read off `token_id:N` strings are built in runs of one kind, kept in order."""
    given = [lp.token_ids is not None for _, lp in rows]
    if any(given) and not all(given):
        runs, start = [], 0
        for i in range(1, len(rows) + 1):
            if i == len(rows) or given[i] != given[start]:
                runs.append(rows_batch(rows[start:i]))
                start = i
        return pa.Table.from_batches(runs).combine_chunks().to_batches()[0]  # (pa.concat_batches: pyarrow >= 19)
    typ, lps = _FIELD_TYPES, [lp for _, lp in rows]
    tok_offsets = _offsets_of(_lengths(lp.tokens for lp in lps))
    tokens = pa.array(list(chain.from_iterable(lp.tokens for lp in lps)), type=pa.string())
    id_rows = _id_rows(tokens, tok_offsets, (lp.tokens[0] if lp.tokens else None for lp in lps))
    ids_valid: np.ndarray | None = None
    if any(given):  # the answer's ids; its strings are ids too where each is `token_id:<that id>`
        id_lengths = _lengths(lp.token_ids for lp in lps)
        token_ids = pa.array(list(chain.from_iterable(lp.token_ids for lp in lps)), type=pa.int64())
        tokens_are_ids = id_rows & (id_lengths == np.diff(tok_offsets))
        if tokens_are_ids.any():
            read, _ = _kept(tokens, tok_offsets, tokens_are_ids)
            sent, _ = _kept(token_ids, _offsets_of(id_lengths), tokens_are_ids)
            equal = pc.equal(_ids(read), sent).to_numpy(zero_copy_only=False)
            tokens_are_ids[tokens_are_ids] = all_per_segment(equal, id_lengths[tokens_are_ids])
    else:  # read off the strings, where every one is an id
        read, id_lengths = _kept(tokens, tok_offsets, id_rows)
        token_ids, ids_valid, tokens_are_ids = _ids(read), id_rows, id_rows
    text, text_lengths = _kept(tokens, tok_offsets, ~tokens_are_ids)

    tops = [lp.top_logprobs for lp in lps]
    positions = _lengths(tops)  # per row
    ks = _lengths(chain.from_iterable(tops))  # per position
    k_offsets = _offsets_of(ks)
    names = pa.array(list(chain.from_iterable(chain.from_iterable(tops))), type=pa.string())
    top_id_rows = _id_rows(names, k_offsets[_offsets_of(positions)], (next(chain.from_iterable(t), None) for t in tops))

    def top_k(rows_kept: np.ndarray, t: pa.DataType, convert: Callable[[pa.Array], pa.Array]) -> pa.Array:
        if not rows_kept.any():
            return pa.nulls(len(lps), t)
        at = np.repeat(rows_kept, positions)  # the positions of the rows kept
        kept, _ = _kept(names, k_offsets, at)
        inner = pa.ListArray.from_arrays(pa.array(_offsets_of(ks[at])), convert(kept), type=t.value_type)
        return _list(inner, np.where(rows_kept, positions, 0), t, rows_kept)

    # float64 and then float32, not float32 from the Python floats: pyarrow converts to float64 at
    # twice the speed, and the cast rounds as that conversion does; a None stays a null (echo)
    scored = pa.array(list(chain.from_iterable(lp.token_logprobs for lp in lps)), type=pa.float64())
    top_lp = _float32(pa.array(list(chain.from_iterable(lp.top_values for lp in lps)), type=pa.float64()))
    has_offsets = np.fromiter((lp.text_offset is not None for lp in lps), dtype=bool, count=len(lps))
    text_offset = pa.array(list(chain.from_iterable(lp.text_offset or () for lp in lps)), type=pa.int64())
    cols = [
        pa.array([k[0] for k, _ in rows], type=pa.string()), pa.array([k[1] for k, _ in rows], type=pa.string()),
        pa.array([k[2] for k, _ in rows], type=pa.int32()),
        _list(token_ids, id_lengths, typ["token_ids"], ids_valid),
        _list(text, text_lengths, typ["tokens"], ~tokens_are_ids),
        pa.array(tokens_are_ids, type=pa.bool_()),
        _list(scored, _lengths(lp.token_logprobs for lp in lps), typ["token_logprobs"]),
        top_k(top_id_rows, typ["top_ids"], _ids),
        top_k(~top_id_rows, typ["top_tokens"], lambda strings: strings),
        _list(pa.ListArray.from_arrays(pa.array(k_offsets), top_lp, type=typ["top_logprobs"].value_type), positions,
              typ["top_logprobs"]),
        _list(text_offset, _lengths(lp.text_offset or () for lp in lps), typ["text_offset"], has_offsets),
    ]
    return pa.RecordBatch.from_arrays(cols, schema=SCHEMA)


def row_batch(key: Key, lp: TokenLogprobs) -> pa.RecordBatch:
    """One record as a one-row batch."""
    return rows_batch([(key, lp)])


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
    """The writer of one token file: a batch of rows at a time, flushed as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # buffered, and flushed after every batch: a batch is ~20 writes of its pieces to an
        # unbuffered file (~20 us a row), one write this way; what is on disk after a flush is the same
        self._sink = pa.BufferedOutputStream(pa.OSFile(str(path), "wb"), WRITE_BUFFER)
        self._writer = pa.ipc.new_stream(self._sink, SCHEMA, options=WRITE_OPTIONS)
        self._rows = self._batches = 0

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
                out._write(batch)
        out._sink.flush()
        os.replace(tmp, path)
        out.path = path
        return out

    def _write(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)
        self._rows += batch.num_rows
        self._batches += 1

    def append(self, key: Key, lp: TokenLogprobs) -> None:
        self.append_rows([(key, lp)])

    def append_rows(self, rows: Sequence[Row]) -> None:
        """`rows` as one batch, on disk (flushed) when this returns."""
        if rows:
            self._write(rows_batch(rows))
            self._sink.flush()

    def close(self) -> None:
        """Close the stream, and rewrite it in batches of READ_BATCH rows where its batches are small
        (rows appended one at a time): a batch per row keeps every row of a killed writer, but
        reading 20k one-row batches costs more than the rows themselves, where batches of
        MIN_BATCH_ROWS or more cost little (the runner's, RunStore.append). The rewrite goes to a
        temp file and replaces the stream whole, so an interruption leaves the first form, complete."""
        if self._writer is None:
            return
        self._writer.close()
        self._sink.close()
        self._writer = None
        if self._batches < 2 or self._rows >= MIN_BATCH_ROWS * self._batches:
            return
        table = read_table(self.path)
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
