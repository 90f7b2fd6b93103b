"""The columnar token files (tokenstore.py): exact round trip, torn tails, resume, old runs."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

import kvqual
from kvqual import tokenstore
from kvqual.records import Sample, TokenLogprobs
from kvqual.store import SAMPLES, load_samples

IDS = TokenLogprobs(tokens=("token_id:5", "token_id:0", "token_id:77"), token_logprobs=(-0.5, -1.25, -2.0),
                    top_logprobs=({"token_id:5": -0.5, "token_id:9": -1.5}, {"token_id:0": -1.25},
                                  {"token_id:77": -2.0, "token_id:1": -2.5, "token_id:3": -3.0}),
                    token_ids=(5, 0, 77))
TEXT = TokenLogprobs(tokens=("Hel", "lo", "\t!"), token_logprobs=(None, -0.75, -0.125),
                     top_logprobs=({"Hel": -0.5, "token_id:4": -1.0}, {"lo": -0.75}, {"\t!": -0.125, "?": -3.5}),
                     text_offset=(0, 3, 5))
NOT_IDS = TokenLogprobs(tokens=("token_id:05", "token_id:1"), token_logprobs=(-1.0, -2.0),
                        top_logprobs=({"token_id:05": -1.0}, {"token_id:1": -2.0}))  # "05" is not how an id prints


ECHO = TokenLogprobs(tokens=("a", "b"), token_logprobs=(None, -0.5), top_logprobs=({}, {"a": None, "b": -1.0}))
TAB = TokenLogprobs(tokens=("token_id:1", "token_id:2"), token_logprobs=(-1.0, -0.5),  # a tab inside one name
                    top_logprobs=({"token_id:5": -0.25, "token_id:6\ttoken_id:7": -0.5}, {}), token_ids=(1, 2))
OTHER_IDS = TokenLogprobs(tokens=("token_id:1", "token_id:2"), token_logprobs=(-1.0, -0.5), token_ids=(1, 3))


@pytest.mark.parametrize("lp", [IDS, TEXT, NOT_IDS, ECHO, TAB, OTHER_IDS],
                         ids=["ids", "text", "id-lookalike", "echo-nulls", "tab-in-a-name", "ids-not-the-strings"])
def test_rows_round_trip_exactly(tmp_path, lp) -> None:
    path = tmp_path / "x.tokens.arrow"
    f = tokenstore.TokenFile.open(path)
    f.append(("s", "1", 0), lp)
    f.close()
    assert tokenstore.load_logprobs(path) == {("s", "1", 0): lp}
    without_top = tokenstore.load_logprobs(path, top_k=False)[("s", "1", 0)]
    assert without_top.tokens == lp.tokens and without_top.token_logprobs == lp.token_logprobs
    assert without_top.top_logprobs == ()


EMPTY = TokenLogprobs(tokens=(), token_logprobs=())
IDS_READ = TokenLogprobs(tokens=IDS.tokens, token_logprobs=IDS.token_logprobs, top_logprobs=IDS.top_logprobs)  # no ids sent
KINDS = [IDS, TEXT, NOT_IDS, ECHO, TAB, OTHER_IDS, EMPTY, IDS_READ]


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_of_rows_of_every_kind_is_those_rows_one_by_one(tmp_path, seed) -> None:
    """rows_batch builds a batch's columns over all its rows at once (per-row masks: ids or strings,
    ids sent or read off the strings, text offsets or none): in any order and mix, the batch is the
    one-row batches concatenated, and reads back exactly."""
    import random

    import pyarrow as pa

    rng = random.Random(seed)
    lps = [rng.choice(KINDS) for _ in range(rng.randint(1, 40))]
    rows = [(("s", str(i), i % 3), lp) for i, lp in enumerate(lps)]
    batch = tokenstore.rows_batch(rows)
    assert batch.equals(pa.concat_batches([tokenstore.row_batch(k, lp) for k, lp in rows]))
    path = tmp_path / "x.tokens.arrow"
    f = tokenstore.TokenFile.open(path)
    f.append_rows(rows[:len(rows) // 2])
    f.append_rows(rows[len(rows) // 2:])
    f.close()
    back = {id(IDS_READ): IDS, id(EMPTY): dataclasses.replace(EMPTY, token_ids=())}  # ids read off the strings (of none: ())
    assert tokenstore.load_logprobs(path) == {k: back.get(id(lp), lp) for k, lp in rows}




def test_files_of_big_batches_are_not_rewritten_on_close(tmp_path) -> None:
    """The runner writes batches of many rows (RunStore's groups): those read fast as they are, so
    closing keeps them (rewriting cost it a seventh of its client CPU per request); one-row batches
    are rewritten (test_closed_files_are_rewritten_in_large_batches)."""
    import pyarrow as pa

    path = tmp_path / "x.tokens.arrow"
    f = tokenstore.TokenFile.open(path)
    for b in range(3):
        f.append_rows([(("s", f"{b}-{i}", 0), IDS) for i in range(tokenstore.MIN_BATCH_ROWS)])
    f.close()
    assert [len(b) for b in pa.ipc.open_stream(pa.OSFile(str(path)))] == [tokenstore.MIN_BATCH_ROWS] * 3
    assert len(tokenstore.load_logprobs(path)) == 3 * tokenstore.MIN_BATCH_ROWS


def test_rows_hold_the_float32_values_pyarrow_makes_of_python_floats_and_keep_nulls() -> None:
    """The row converts the logprobs to float64 and narrows the top-k to float32: the same values as
    converting the Python floats to float32 directly (rounded to nearest; beyond float32's range an
    infinity), a null a null, never NaN."""
    import random

    import pyarrow as pa

    rng = random.Random(15)
    values = [rng.uniform(-30.0, 0.0) for _ in range(300)] + [-1e300, -9999.0, 0.0, -1e-50, -3.4028235677973366e38]
    tops = tuple({f"w{i}": v, "x": v - 1.0} for i, v in enumerate(values))
    lp = TokenLogprobs(tokens=tuple(f"w{i}" for i in range(len(values))), token_logprobs=tuple(values),
                       top_logprobs=tops, text_offset=tuple(range(len(values))))
    row = tokenstore.row_batch(("s", "1", 0), lp)
    assert row.column("top_logprobs").to_pylist() == [[pa.array(list(t.values()), type=pa.float32()).to_pylist()
                                                      for t in tops]]
    assert row.column("token_logprobs").to_pylist() == [values]
    echo = tokenstore.row_batch(("s", "2", 0), ECHO)
    assert echo.column("top_logprobs").to_pylist() == [[[], [None, -1.0]]]
    assert echo.column("token_logprobs").to_pylist() == [[None, -0.5]]


def test_closed_files_are_rewritten_in_large_batches(tmp_path) -> None:
    import pyarrow as pa

    path = tmp_path / "x.tokens.arrow"
    f = tokenstore.TokenFile.open(path)
    for i in range(10):
        f.append(("s", str(i), 0), IDS)
    f.close()
    assert len(list(pa.ipc.open_stream(pa.OSFile(str(path))))) == 1
    assert len(tokenstore.load_logprobs(path)) == 10


def test_torn_last_batch_is_dropped_and_reopen_rewrites_what_is_kept(tmp_path) -> None:
    path = tmp_path / "x.tokens.arrow"
    f = tokenstore.TokenFile.open(path)
    for i in range(5):
        f.append(("s", str(i), 0), IDS)  # each row flushed as its own batch; killed before close()
    path.write_bytes(path.read_bytes()[:-40])  # ... inside its last batch
    assert [k[1] for k in tokenstore.keys_of(tokenstore.read_table(path))] == ["0", "1", "2", "3"]
    f = tokenstore.TokenFile.open(path, keep=lambda k: k[1] != "1")
    f.append(("s", "9", 0), TEXT)
    f.close()
    rows = tokenstore.load_logprobs(path)
    assert sorted(k[1] for k in rows) == ["0", "2", "3", "9"] and rows[("s", "9", 0)] == TEXT


def _sample(i: int, lp: TokenLogprobs | None) -> Sample:
    return Sample(id=str(i), suite="s", repeat=0, text="Hello!", finish_reason="stop", completion_tokens=3,
                  error=None, logprobs=lp)


def test_store_writes_answers_in_groups_each_row_before_its_line(tmp_path, monkeypatch) -> None:
    """RunStore writes FLUSH_ROWS answers at a time, what waits once its first is FLUSH_SECONDS old
    (on the next answer), what waits at the runner's `flush` (every FLUSH_SECONDS), and what is left
    on close: token rows first, then lines, so a line on disk always has its row; until written,
    nothing of an answer is on disk."""
    from test_store import manifest

    from kvqual import store as store_module
    from kvqual.store import RunStore

    now = [100.0]
    monkeypatch.setattr(store_module, "FLUSH_ROWS", 3)
    monkeypatch.setattr(store_module.time, "monotonic", lambda: now[0])
    store = RunStore.open(tmp_path, manifest())
    run = tmp_path / "t-abc"

    def on_disk() -> tuple[list[str], list[str]]:
        lines = [json.loads(x)["id"] for x in (run / SAMPLES).read_text().splitlines()]
        return lines, [k[1] for k in tokenstore.keys_of(tokenstore.read_table(run / "samples.tokens.arrow"))]

    store.append(_sample(0, IDS))
    store.append(_sample(1, None))
    assert on_disk() == ([], []) and store.done == {("s", "0", 0), ("s", "1", 0)}
    store.append(_sample(2, TEXT))
    assert on_disk() == (["0", "1", "2"], ["0", "2"])
    store.append(_sample(3, IDS))
    now[0] += store_module.FLUSH_SECONDS / 2
    store.append(_sample(4, IDS))  # the first waiting is half as old as FLUSH_SECONDS: held
    assert on_disk()[0] == ["0", "1", "2"]
    now[0] += store_module.FLUSH_SECONDS / 2
    store.append(_sample(5, TEXT))  # now it is that old: all three written
    assert on_disk() == (["0", "1", "2", "3", "4", "5"], ["0", "2", "3", "4", "5"])
    store.flush()  # nothing waits: nothing written
    store.append(_sample(6, IDS))
    store.flush()  # the runner's, whatever its age
    assert on_disk()[0] == [str(i) for i in range(7)]
    store.append(_sample(7, IDS))
    store.close()
    assert on_disk() == ([str(i) for i in range(8)], ["0", "2", "3", "4", "5", "6", "7"])
    assert load_samples(run)[("s", "7", 0)].logprobs == IDS


def test_store_writes_token_rows_beside_readable_lines_and_resumes(tmp_path) -> None:
    from test_store import manifest

    from kvqual.store import RunStore

    store = RunStore.open(tmp_path, manifest())
    for i, lp in enumerate((IDS, TEXT, None)):
        store.append(_sample(i, lp))
    store.close()
    run = tmp_path / "t-abc"
    lines = [json.loads(x) for x in (run / SAMPLES).read_text().splitlines()]
    assert [x["logprobs"] for x in lines] == [None, None, None]  # the per-token data is in the token file
    assert [x.get("token_data") for x in lines] == [True, True, None] and lines[0]["text"] == "Hello!"
    assert (run / "samples.tokens.arrow").is_file()
    want = {("s", str(i), 0): _sample(i, lp) for i, lp in enumerate((IDS, TEXT, None))}
    assert load_samples(run) == want
    assert load_samples(run, "inline")[("s", "0", 0)].logprobs is None
    store = RunStore.open(tmp_path, manifest())  # resume: compacted, every answer kept, appendable
    store.append(_sample(7, IDS))
    store.close()
    assert load_samples(run) == {**want, ("s", "7", 0): _sample(7, IDS)}


def test_a_line_whose_row_is_missing_is_not_an_answer(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    lines = [{**_sample(1, None).to_json(), "token_data": True}, _sample(2, IDS).to_json()]  # 2: the old inline form
    (run / SAMPLES).write_text("".join(json.dumps(x) + "\n" for x in lines))
    samples = load_samples(run)
    assert list(samples) == [("s", "2", 0)] and samples[("s", "2", 0)].logprobs == IDS


def test_commands_that_do_not_serve_import_neither_torch_nor_transformers_and_the_judge_no_openai() -> None:
    code = ("import sys\nfrom kvqual.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "from kvqual.cli import build_parser\nbuild_parser()\nimport kvqual.judge.judge\n"  # what `kvqual report` runs
            "print(sorted(m for m in ('torch', 'transformers', 'openai') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr


def test_version_imports_neither_torch_nor_pandas() -> None:
    """`kvqual --version` (0.6 s; issue 15's bar is 1 s, benchmarks/docs/performance.md) builds the
    parser, which imports the token store: no pa.array at import, since pyarrow's first one imports
    pandas (~0.3 s), and nothing of the model (torch, transformers) or the SDK."""
    code = ("import sys, runpy\nsys.argv = ['kvqual', '--version']\ntry:\n    runpy.run_module('kvqual', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in ('torch', 'transformers', 'openai', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines() == [f"kvqual {kvqual.__version__}", "[]"], out.stdout + out.stderr


def test_mapped_batches_held_by_the_caller_stay_whole(tmp_path, monkeypatch) -> None:
    """The file is mapped and each batch's pages dropped once the caller has had it: batches (and
    arrays viewing them) the caller keeps still read their bytes, across many page-sized batches,
    and equal what a plain read of the stream gives."""
    import pyarrow as pa

    monkeypatch.setattr(tokenstore, "READ_BATCH", 3)
    path = tmp_path / "x.tokens.arrow"
    f = tokenstore.TokenFile.open(path)
    lps = [IDS, TEXT, NOT_IDS, ECHO, TAB, OTHER_IDS] * 200  # ~1,200 rows: batches across many pages
    for i, lp in enumerate(lps):
        f.append(("s", str(i), 0), lp)
    f.close()
    kept = list(tokenstore.iter_batches(path))  # every batch held while later pages are dropped
    assert len(kept) == 400
    plain = pa.Table.from_batches(list(pa.ipc.open_stream(pa.OSFile(str(path)))))
    assert pa.Table.from_batches(kept).equals(plain)
    views = [b.column("top_logprobs").flatten().flatten().to_numpy(zero_copy_only=False) for b in kept]
    assert sum(v.size for v in views) == sum(len(t) for lp in lps for t in lp.top_logprobs)
    assert tokenstore.load_logprobs(path) == {("s", str(i), 0): lp for i, lp in enumerate(lps)}
