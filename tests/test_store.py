"""The results store: one writer per run folder (an flock freed when its holder dies), counts over resumes,
failure kinds."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import kvqual
from kvqual.errors import UsageError
from kvqual.records import GenerationParams, RunManifest, Sample
from kvqual.store import (LOCK, SAMPLES, RunLock, RunStore, answered_keys, error_kind, failure_counts,
                          load_manifest, load_samples)


def manifest(run_id="t-abc", **kw):
    return RunManifest(run_id=run_id, key="k", target="t", base_urls=("http://x/v1",), model="m",
                       kv_cache_dtype=None, suites=(), params=GenerationParams(), limit=None, replicate=0,
                       fraction=1.0, concurrency=1, status="running", started_at=1.0, finished_at=None,
                       counts={}, **kw)


def sample(i, error=None):
    return Sample(id=f"i{i}", suite="s", repeat=0, text=None if error else f"a{i}", finish_reason="stop",
                  completion_tokens=1, error=error)


def test_a_second_writer_is_refused_naming_folder_and_pid_and_loses_nothing(tmp_path):
    store = RunStore.open(tmp_path, manifest())
    store.append(sample(0))
    store.append(sample(1))
    with pytest.raises(UsageError) as exc:
        RunStore.open(tmp_path, manifest())  # a new open file description: flock refuses it as another process
    assert str(exc.value) == (f"{tmp_path / 't-abc'}: another kvqual process (pid {os.getpid()}) is writing "
                              "this run folder; wait for it to finish, or pass --out for another results folder")
    assert exc.value.exit_code == 2
    store.append(sample(2))  # the first writer goes on, its file untouched by the refused one
    store.close()
    assert sorted(k[1] for k in load_samples(tmp_path / "t-abc")) == ["i0", "i1", "i2"]
    again = RunStore.open(tmp_path, manifest())  # freed by close: the next run resumes
    assert again.done == {("s", "i0", 0), ("s", "i1", 0), ("s", "i2", 0)}
    again.close()


def test_rerun_moves_the_old_folder_aside_under_the_lock(tmp_path):
    first = RunStore.open(tmp_path, manifest())
    first.append(sample(0))
    first.close()
    lock = RunLock.acquire(tmp_path / "t-abc")
    store = RunStore.open(tmp_path, manifest(), rerun=True, lock=lock)
    (backup,) = [p for p in tmp_path.iterdir() if p.name.startswith("t-abc.old-")]
    assert answered_keys(backup) == {("s", "i0", 0)} and store.done == set()
    with pytest.raises(UsageError, match="is writing this run folder"):
        RunLock.acquire(tmp_path / "t-abc")  # the new folder is held
    RunLock.acquire(backup).release()  # the old one was let go
    store.close()
    RunLock.acquire(tmp_path / "t-abc").release()


def test_the_lock_dies_with_its_holder(tmp_path):
    run_dir = tmp_path / "t-abc"
    src = str(Path(kvqual.__file__).parents[1])
    code = (f"import sys, time; sys.path.insert(0, {src!r}); from kvqual.store import RunLock; "
            f"RunLock.acquire({str(run_dir)!r}); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(UsageError, match=f"another kvqual process \\(pid {holder.pid}\\)"):
            RunLock.acquire(run_dir)
        assert (run_dir / LOCK).read_text() == f"{holder.pid}\n"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 5
    while True:  # no stale lock: the kernel freed it with the process
        try:
            RunLock.acquire(run_dir).release()
            break
        except UsageError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_resume_carries_retries_and_reconnects_and_counts_the_resume(tmp_path):
    store = RunStore.open(tmp_path, manifest())
    store.manifest = replace(store.manifest, counts={"retries": 3, "reconnects": 7, "ok": 1})
    store.write_manifest()
    store.close()
    again = RunStore.open(tmp_path, manifest())
    assert dict(again.manifest.counts) == {"retries": 3, "reconnects": 7, "resumes": 1}
    again.close()
    assert load_manifest(tmp_path / "t-abc").counts["resumes"] == 1


def test_failure_counts_by_kind_for_the_keys_still_unanswered(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    lines = [sample(0, 'HTTP 500: {"error": "always broken"}'), sample(1, "HTTP 500: other"),
             sample(2, "timeout"), sample(3, "connection error: refused"), sample(4),
             sample(5, "HTTP 503: busy"), sample(5)]  # i5 failed, then answered: not a failure any more
    (run_dir / SAMPLES).write_text("".join(json.dumps(s.to_json()) + "\n" for s in lines) + '{"torn')
    assert failure_counts(run_dir) == {"HTTP 500": 2, "timeout": 1, "connection error": 1}
    assert answered_keys(run_dir) == {("s", "i4", 0), ("s", "i5", 0)}
    assert error_kind("HTTP 429: slow down") == "HTTP 429" and error_kind("malformed response: x") == \
        "malformed response"
    assert failure_counts(tmp_path / "missing") == {} and answered_keys(tmp_path / "missing") == set()


def test_decode_line_reads_what_json_loads_reads():
    """orjson first, the standard decoder for what it refuses or reads differently: same objects,
    same failures (a torn line), NaN / Infinity and integers beyond 64 bits included."""
    from kvqual.store import decode_line

    lines = [b'{"id":"a","x":1.5,"n":3,"t":"caf\\u00e9 \\u2028"}\n', b'{"a": NaN, "b": -Infinity}',
             b'{"a": 123456789012345678901234567890}', b'{"a": [1, {"b": -9223372036854775809}]}',
             b'{"a": 1e19, "b": 18446744073709551615}', b'{"a": "\\ud800"}', b'{"a":"\xff"}', b'{"a":"x"}\r\n',
             b'[1, 2]', b'0.1000000000000000055511151231257827']
    for raw in lines:
        assert repr(decode_line(raw)) == repr(json.loads(raw.decode("utf-8", errors="replace"))), raw
    for torn in (b'{"a": 1', b'\xff{"a":1}', b''):
        with pytest.raises(json.JSONDecodeError):
            json.loads(torn.decode("utf-8", errors="replace"))
        with pytest.raises(json.JSONDecodeError):
            decode_line(torn)
