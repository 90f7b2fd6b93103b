"""The runner against a real HTTP server on loopback (tests/fakeserver.py)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from kvtest import LoopbackServer, write_config, write_suite
from kvqual.config import RunDefaults, Target
from kvqual.errors import InfrastructureError, ServerContractError
from kvqual.plan import in_fraction, item_order, plan_units
from kvqual.runner import run_target
from kvqual.store import RETRIED, load_manifest, load_samples
from kvqual.suites import load_suites


def suite(tmp_path, items, name="s.jsonl"):
    return tuple(load_suites([str(write_suite(tmp_path / name, items))], seed=0, limit=None))


def run(tmp_path, server, suites, **kw):
    target = Target(name="t", base_urls=(server.base_url,))
    defaults = RunDefaults(**{"results_dir": str(tmp_path / "results"), "retries": 3, "timeout": 10, **kw})
    return asyncio.run(run_target(target, suites, defaults, progress=False))


def test_records_every_answer_with_fields(tmp_path, fake_server):
    server = fake_server()
    items = [{"id": f"q{i}", "prompt": f"Q{i} [[answer={i}]]", "answer": str(i), "scorer": "exact"} for i in range(6)]
    items.append({"id": "c", "messages": [{"role": "user", "content": "hello there"}]})
    m = run(tmp_path, server, suite(tmp_path, items), top_logprobs=3)
    assert m.status == "complete" and m.counts["ok"] == 7 and m.model == "fake-model"
    samples = load_samples(tmp_path / "results" / m.run_id)
    assert set(samples) == {("s", f"q{i}", 0) for i in range(6)} | {("s", "c", 0)}
    s = samples[("s", "q3", 0)]
    assert (s.text, s.finish_reason, s.error, s.score, s.completion_tokens) == (" 3", "stop", None, 1.0, 1)
    assert s.logprobs.tokens == (" 3",) and len(s.logprobs.top_logprobs[0]) == 3
    assert s.latency_s > 0 and s.started_at > 0
    assert samples[("s", "c", 0)].text == " ok there"
    manifest = json.loads((tmp_path / "results" / m.run_id / "manifest.json").read_text())
    assert manifest["suites"][0]["sha256"] and manifest["params"]["top_logprobs"] == 3
    assert manifest["server_info"]["models"] == ["fake-model"] and "api_key" not in json.dumps(manifest)


def test_transient_failures_are_retried(tmp_path, fake_server):
    server = fake_server()
    items = [{"id": "f", "prompt": "flaky one"}, {"id": "r", "prompt": "ratelimit me"}]
    m = run(tmp_path, server, suite(tmp_path, items))
    samples = load_samples(tmp_path / "results" / m.run_id)
    assert samples[("s", "f", 0)].ok and samples[("s", "f", 0)].attempts == 3
    assert samples[("s", "r", 0)].ok and samples[("s", "r", 0)].attempts == 2
    assert server.stats() == {"flaky one": 3, "ratelimit me": 2}


def test_failed_requests_are_recorded_never_answered(tmp_path, fake_server):
    server = fake_server()
    items = [{"id": "b", "prompt": "broken"}, {"id": "x", "prompt": "badrequest"}] + \
            [{"id": str(i), "prompt": f"fine {i}"} for i in range(40)]
    m = run(tmp_path, server, suite(tmp_path, items), max_failed_rate=0.5)
    samples = load_samples(tmp_path / "results" / m.run_id)
    broken, bad = samples[("s", "b", 0)], samples[("s", "x", 0)]
    assert broken.text is None and "HTTP 500" in broken.error and broken.attempts == 4  # 1 + 3 retries
    assert bad.text is None and "HTTP 400" in bad.error and bad.attempts == 1  # 4xx is final
    assert m.status == "incomplete" and m.counts["failed"] == 2


def test_too_many_failures_is_infrastructure(tmp_path, fake_server):
    server = fake_server()
    items = [{"id": "b", "prompt": "broken"}, {"id": "ok", "prompt": "fine"}]
    with pytest.raises(InfrastructureError, match="1 of 2 requests failed"):
        run(tmp_path, server, suite(tmp_path, items), retries=0)


def test_dropped_logprobs_stop_the_run(tmp_path, fake_server):
    server = fake_server("--no-logprobs")
    with pytest.raises(ServerContractError, match="logprobs were requested"):
        run(tmp_path, server, suite(tmp_path, [{"id": "a", "prompt": "x"}]))


def test_unreachable_target(tmp_path):
    target = Target(name="t", base_urls=("http://127.0.0.1:9/v1",))
    with pytest.raises(InfrastructureError, match="unreachable"):
        asyncio.run(run_target(target, (), RunDefaults(results_dir=str(tmp_path)), progress=False))


def test_finished_run_is_reused_and_failures_retried(tmp_path, fake_server):
    server = fake_server()
    items = [{"id": str(i), "prompt": f"p {i}"} for i in range(5)]
    s = suite(tmp_path, items)
    first = run(tmp_path, server, s)
    second = run(tmp_path, server, s)
    assert first.run_id == second.run_id and sum(server.stats().values()) == 5  # no new request


def test_order_is_seeded_and_fraction_is_stable(tmp_path):
    s = suite(tmp_path, [{"id": str(i), "prompt": f"p {i}"} for i in range(50)])
    a = [(i.id, r) for i, r in plan_units(s, 2, seed=1)]
    assert a == [(i.id, r) for i, r in plan_units(s, 2, seed=1)] and a != [(i.id, r) for i, r in plan_units(s, 2, seed=2)]
    quarter = [i.id for i in s[0].items if in_fraction("s", i.id, 0.25)]
    assert 5 <= len(quarter) <= 22
    assert len(plan_units(s, 1, seed=1, fraction=0.25)) == len(quarter)


def test_item_order_is_a_property_of_each_item_so_any_subset_keeps_it():
    keys = [("s", str(i)) for i in range(40)]
    full = item_order(keys, seed=7)
    subset = item_order(keys[::3], seed=7)
    assert subset == [k for k in full if k in set(keys[::3])]
    assert full != item_order(keys, seed=8) and sorted(full) == sorted(keys)


def test_rounds_send_each_items_units_once_and_resume_into_one_run(tmp_path, fake_server):
    server = fake_server()
    s = suite(tmp_path, [{"id": str(i), "prompt": f"round prompt {i}"} for i in range(20)])
    target = Target(name="t", base_urls=(server.base_url,))
    defaults = RunDefaults(results_dir=str(tmp_path / "results"), retries=1, timeout=10, repeats=2)
    first = asyncio.run(run_target(target, s, defaults, progress=False, items_upto=5))
    assert first.status == "partial" and first.counts["ok"] == 10 and first.counts["plan_units"] == 40
    order = item_order([("s", str(i)) for i in range(20)], seed=defaults.seed)
    done = {k[1] for k in load_samples(tmp_path / "results" / first.run_id)}
    assert done == {k[1] for k in order[:5]}  # the first five items of the seeded order, both repeats
    again = asyncio.run(run_target(target, s, defaults, progress=False, items_upto=5))
    assert sum(server.stats().values()) == 10 and again.run_id == first.run_id  # nothing sent twice
    last = asyncio.run(run_target(target, s, defaults, progress=False, items_upto=20))
    assert last.status == "complete" and last.run_id == first.run_id and sum(server.stats().values()) == 40


def test_resume_after_sigkill(tmp_path, fake_server):
    """Killed halfway and run again: every id exactly once, no second request for an answered id."""
    server = fake_server("--delay", "0.05")
    items = [{"id": f"i{i}", "prompt": f"prompt {i}"} for i in range(60)]
    write_suite(tmp_path / "s.jsonl", items)
    write_config(tmp_path / "kvqual.toml", {"t": server.base_url})
    cmd = [sys.executable, "-m", "kvqual", "run", "t", "--suite", "s.jsonl", "--concurrency", "2"]
    env = {**os.environ, "CI": "true"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    results = tmp_path / "results"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        files = list(results.glob("*/samples.jsonl"))
        if files and files[0].read_text().count("\n") >= 20:
            break
        assert proc.poll() is None, proc.communicate()[1].decode()
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    answered_before = {json.loads(l)["id"] for l in files[0].read_text().splitlines() if l.strip()}
    assert 20 <= len(answered_before) < 60
    # the killed run's manifest said "running" with empty counts; the next reader marks it interrupted and
    # counts what is on disk, on disk too (issue 53)
    assert json.loads((files[0].parent / "manifest.json").read_text())["status"] == "running"
    read = load_manifest(files[0].parent)
    assert read.status == "incomplete" and read.counts["interrupted"] == 1
    assert (read.counts["ok"], read.counts["failed"]) == (len(answered_before), 0)
    on_disk = json.loads((files[0].parent / "manifest.json").read_text())
    assert on_disk["status"] == "incomplete" and on_disk["counts"]["ok"] == len(answered_before)
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(l) for l in files[0].read_text().splitlines()]
    assert sorted(l["id"] for l in lines) == sorted(i["id"] for i in items)  # each exactly once
    counts = server.stats()
    assert all(counts[f"prompt {i[1:]}"] == 1 for i in answered_before)
    assert load_manifest(files[0].parent).status == "complete"
    assert not (files[0].parent / RETRIED).exists()


def test_lmeval_suite_runs_through_the_runner(tmp_path, fake_server):
    """An lm-eval task (the shipped offline one) lands in samples.jsonl, keyed for pairing."""
    server = fake_server()
    suites = tuple(load_suites(["lm-eval:kvqual_arith"], seed=0, limit=5))
    target = Target(name="t", base_urls=(server.base_url,))
    m = asyncio.run(run_target(target, suites, RunDefaults(results_dir=str(tmp_path), limit=5), limit=5,
                               progress=False))
    samples = load_samples(tmp_path / m.run_id)
    assert len(samples) == 5 and all(k[0] == "lm-eval:kvqual_arith" for k in samples)
    assert all(s.ok and s.score == 0.0 for s in samples.values())  # the fake answers " ok ...": wrong


def test_streamed_run_records_the_same_answers_plus_ttft_and_itl(tmp_path, fake_server):
    server = fake_server("--token-delay", "0.02")
    items = [{"id": f"q{i}", "prompt": f"Q{i} [[answer=a b c {i}]]", "answer": f"a b c {i}"} for i in range(4)]
    items.append({"id": "c", "messages": [{"role": "user", "content": "say three words"}]})
    plain = run(tmp_path / "plain", server, suite(tmp_path, items), top_logprobs=2)
    streamed = run(tmp_path / "stream", server, suite(tmp_path, items), top_logprobs=2, stream=True)
    a = load_samples(tmp_path / "plain" / "results" / plain.run_id)
    b = load_samples(tmp_path / "stream" / "results" / streamed.run_id)
    assert set(a) == set(b) and len(b) == 5
    for key in a:
        assert (b[key].text, b[key].finish_reason, b[key].completion_tokens, b[key].logprobs) == \
               (a[key].text, a[key].finish_reason, a[key].completion_tokens, a[key].logprobs)
        assert a[key].ttft_s is None and a[key].itl_s is None
        # 4 tokens 20 ms apart: first token after ≥ 20 ms, the next three ≈ 20 ms each
        assert 0.015 < b[key].ttft_s < b[key].latency_s
        assert 0.015 < b[key].itl_s < 0.2
    assert json.loads((tmp_path / "stream" / "results" / streamed.run_id / "manifest.json").read_text())[
        "params"]["stream"] is True


def test_an_error_mid_stream_is_a_failure_not_an_answer(tmp_path, fake_server):
    server = fake_server("--stream-error")
    items = [{"id": "q", "prompt": "Q [[answer=a b c]]", "answer": "a b c"}]
    with pytest.raises(InfrastructureError):
        run(tmp_path, server, suite(tmp_path, items), stream=True)
    (run_dir,) = (tmp_path / "results").glob("t-*")
    (sample,) = load_samples(run_dir).values()
    assert sample.text is None and not sample.ok and "engine died mid-stream" in sample.error


def test_server_side_figures_come_from_prometheus(tmp_path, fake_server):
    server = fake_server("--metrics", "--delay", "0.5")
    # 32 requests of 0.5 s, 4 at a time: 4 s, so the 2-s poll sees requests running
    items = [{"id": f"q{i}", "prompt": f"Q{i} [[answer=a b {i}]]"} for i in range(32)]
    m = run(tmp_path, server, suite(tmp_path, items), concurrency=4)
    sm = m.server_metrics
    assert sm["source"] == "vllm" and sm["scrapes"] >= 2
    assert sm["generation_tokens"] == 32 * 3 and sm["prompt_tokens"] == 32 * 4  # "Q0", " [[answer=a", " b", " 0]]"
    assert sm["gen_tok_s"] > 0 and 1 <= sm["running_peak"] <= 4
    assert sm["ttft_mean_s"] == pytest.approx(0.51) and sm["kv_usage_peak"] == pytest.approx(0.01 * sm["running_peak"])
    on_disk = json.loads((tmp_path / "results" / m.run_id / "manifest.json").read_text())
    assert on_disk["server_metrics"] == sm


def _run_cmd(tmp_path, server, n_items, *flags):
    items = [{"id": f"i{i}", "prompt": f"prompt {i}"} for i in range(n_items)]
    write_suite(tmp_path / "s.jsonl", items)
    write_config(tmp_path / "kvqual.toml", {"t": server.base_url})
    return items, [sys.executable, "-m", "kvqual", "run", "t", "--suite", "s.jsonl", *flags]


def test_a_second_run_on_the_same_folder_is_refused_and_the_first_loses_nothing(tmp_path):
    server = LoopbackServer(gated=True)  # holds every answer until released: the first run is mid-flight
    items, cmd = _run_cmd(tmp_path, server, 20, "--concurrency", "2", "--top-logprobs", "0")
    env = {**os.environ, "CI": "true"}
    first = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while server.posts < 2:  # the first holds the folder and has requests in flight
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.02)
        second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    finally:
        server.release()
    (samples,) = (tmp_path / "results").glob("*/samples.jsonl")
    assert second.returncode == 2 and second.stdout == ""
    assert second.stderr == (f"kvqual: error: results/{samples.parent.name}: another kvqual process "
                             f"(pid {first.pid}) is writing this run folder; wait for it to finish, "
                             "or pass --out for another results folder\n")
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    ids = [json.loads(line)["id"] for line in samples.read_text().splitlines()]
    assert sorted(ids) == sorted(i["id"] for i in items)  # every id exactly once
    assert server.posts == 20  # the refused run sent nothing
    assert load_manifest(samples.parent).status == "complete"


def test_a_manifest_that_says_complete_over_missing_samples_is_resumed(tmp_path, fake_server, capsys):
    server = fake_server()
    s = suite(tmp_path, [{"id": f"i{i}", "prompt": f"p {i}"} for i in range(6)])
    first = run(tmp_path, server, s, top_logprobs=0)
    run_dir = tmp_path / "results" / first.run_id
    lines = (run_dir / "samples.jsonl").read_text().splitlines(keepends=True)
    lost = {json.loads(line)["id"] for line in lines[:2]}
    (run_dir / "samples.jsonl").write_text("".join(lines[2:]))  # what a second writer used to do
    assert load_manifest(run_dir).status == "complete"
    capsys.readouterr()
    again = run(tmp_path, server, s, top_logprobs=0)
    assert capsys.readouterr().err == (f"kvqual: {run_dir}: the manifest says complete but samples.jsonl lacks "
                                       "2 of 6 units; resuming the run to ask for them\n")
    assert again.status == "complete" and again.counts["ok"] == 6 and again.counts["resumes"] == 1
    assert sorted(k[1] for k in load_samples(run_dir)) == [f"i{i}" for i in range(6)]
    stats = server.stats()
    assert {p for p, n in stats.items() if n == 2} == {f"p {i[1:]}" for i in lost} and sum(stats.values()) == 8
    run(tmp_path, server, s, top_logprobs=0)  # now whole: reused, nothing sent
    assert sum(server.stats().values()) == 8


def test_kvqual_run_that_ends_with_failed_requests_exits_4(tmp_path, fake_server, capsys):
    from kvqual.cli import main

    server = fake_server()
    items = [{"id": "b", "prompt": "broken"}, {"id": "x", "prompt": "badrequest"}] + \
            [{"id": str(i), "prompt": f"fine {i}"} for i in range(48)]
    write_suite(tmp_path / "s.jsonl", items)
    write_config(tmp_path / "kvqual.toml", {"t": server.base_url})
    out = tmp_path / "results"
    argv = ["run", "t", "--suite", str(tmp_path / "s.jsonl"), "--config", str(tmp_path / "kvqual.toml"),
            "--out", str(out), "--retries", "1", "--top-logprobs", "0"]
    assert main(argv) == 4  # 2 of 50 failed: under max_failed_rate (5%), so no abort, but not a clean run
    captured = capsys.readouterr()
    (run_dir,) = out.glob("t-*")
    assert captured.out == (f"{run_dir.name}: 48/50 answered, 2 failed, 1 retries, 0 reconnects (incomplete) "
                            f"→ {run_dir}\n")
    progress, error = captured.err.splitlines()  # the closing progress line, then one line of error
    assert progress.startswith(f"kvqual: {run_dir.name}: 50/50 done")
    assert error == (f"kvqual: error: t: run incomplete: 2 of 50 requests failed for good (HTTP 400 ×1, "
                     f"HTTP 500 ×1); errors are in {run_dir}/samples.jsonl — run the same command again "
                     "to retry them")
    assert server.stats()["broken"] == 2 and server.stats()["badrequest"] == 1  # 1 + 1 retry; 4xx is final
    assert load_manifest(run_dir).counts["retries"] == 1


def test_a_keepalive_connection_closed_by_the_server_is_a_reconnect_not_a_retry(tmp_path):
    server = LoopbackServer(close="reused")
    s = suite(tmp_path, [{"id": f"i{i}", "prompt": f"p{i}"} for i in range(12)])
    m = run(tmp_path, server, s, top_logprobs=0, concurrency=1)
    samples = load_samples(tmp_path / "results" / m.run_id)
    assert m.status == "complete" and len(samples) == 12 and all(x.ok for x in samples.values())
    assert all(x.attempts == 1 for x in samples.values())  # no request failed: no retry
    # every request after the first found its connection closed once and went again on a new one
    assert server.closed == 11 and server.posts == 23
    assert (m.counts["retries"], m.counts["reconnects"]) == (0, 11)
    on_disk = json.loads((tmp_path / "results" / m.run_id / "manifest.json").read_text())
    assert (on_disk["counts"]["retries"], on_disk["counts"]["reconnects"]) == (0, 11)


def test_a_keepalive_connection_reset_before_the_response_is_a_reconnect_not_a_retry(tmp_path):
    """Issue 53: a reset (not a clean close) on a reused connection before any byte of the response is
    the server's keep-alive timeout too, and cost an attempt; now it is a free reconnect."""
    server = LoopbackServer(close="reset-reused")
    s = suite(tmp_path, [{"id": f"i{i}", "prompt": f"p{i}"} for i in range(12)])
    m = run(tmp_path, server, s, top_logprobs=0, concurrency=1)
    samples = load_samples(tmp_path / "results" / m.run_id)
    assert m.status == "complete" and all(x.ok and x.attempts == 1 for x in samples.values())
    assert server.closed == 11 and (m.counts["retries"], m.counts["reconnects"]) == (0, 11)


def test_a_reset_on_a_fresh_connection_is_a_failure_not_a_reconnect(tmp_path):
    """What a crashed server's socket sends: every request reset, on new connections as well. No free
    reconnect: each reset spends an attempt."""
    server = LoopbackServer(close="reset")
    s = suite(tmp_path, [{"id": "a", "prompt": "pa"}])
    with pytest.raises(InfrastructureError):
        run(tmp_path, server, s, top_logprobs=0, retries=1)
    (run_dir,) = (tmp_path / "results").glob("t-*")
    (x,) = load_samples(run_dir).values()
    assert x.attempts == 2 and server.posts == 2 and load_manifest(run_dir).counts["reconnects"] == 0


def test_a_server_that_always_closes_unanswered_fails_after_bounded_reconnects_and_retries(tmp_path):
    from kvqual.retry import MAX_RECONNECTS

    server = LoopbackServer(close="always")
    s = suite(tmp_path, [{"id": "a", "prompt": "pa"}])
    with pytest.raises(InfrastructureError, match=r"1 of 1 requests failed \(100.0% > max_failed_rate 5.0%: "
                                                  r"connection error ×1\)"):
        run(tmp_path, server, s, top_logprobs=0, retries=1)
    (run_dir,) = (tmp_path / "results").glob("t-*")
    (x,) = load_samples(run_dir).values()
    assert x.error == ("connection error: the server closed the connection before responding "
                       f"(after {MAX_RECONNECTS} reconnects)")
    assert x.attempts == 2 and server.posts == 2 + MAX_RECONNECTS  # 1 + 1 retry, plus the free reconnects
    counts = load_manifest(run_dir).counts
    assert (counts["retries"], counts["reconnects"]) == (1, MAX_RECONNECTS)


def _chained(*excs):
    """The last exception, raised from the one before it, and so on (as the SDK and transport chain them)."""
    for cause, exc in zip(excs, excs[1:]):
        exc.__cause__ = cause
    return excs[-1]


def test_closed_before_response_knows_a_clean_close_from_other_connection_failures():
    import errno
    from types import SimpleNamespace

    import aiohttp
    import httpx
    import openai

    from kvqual.retry import closed_before_response

    request = httpx.Request("POST", "http://h/v1/completions")
    sdk = lambda: openai.APITimeoutError(request=request)  # noqa: E731 - what the SDK raises on aiohttp
    assert closed_before_response(_chained(aiohttp.ServerDisconnectedError(), httpx.ConnectTimeout("x"), sdk()))
    assert closed_before_response(_chained(httpx.RemoteProtocolError("Server disconnected without sending a "
                                                                     "response."), sdk()))
    assert not closed_before_response(_chained(aiohttp.ServerDisconnectedError("partial response"), sdk()))
    assert not closed_before_response(_chained(aiohttp.ClientOSError(errno.ECONNRESET, "reset by peer"), sdk()))
    refused = aiohttp.ClientConnectorError(SimpleNamespace(host="h", port=1, ssl=False),
                                           OSError(errno.ECONNREFUSED, "refused"))  # the server is down
    assert not closed_before_response(_chained(refused, sdk()))
    assert not closed_before_response(sdk()) and not closed_before_response(ValueError("not json"))


def test_an_answer_is_written_while_the_next_is_awaited(tmp_path, fake_server, monkeypatch):
    """The store writes answers in groups (store.py); while the runner waits on a slow server it
    flushes the store every FLUSH_SECONDS, so a kill then loses at most that much, however long
    the next answer takes. Here each answer takes 0.6 s and FLUSH_SECONDS is 0.1: every answer is
    on disk before the next is taken, not all at the end."""
    from kvqual import runner, store

    monkeypatch.setattr(store, "FLUSH_SECONDS", 0.1)
    monkeypatch.setattr(runner, "FLUSH_SECONDS", 0.1)
    events: list[str] = []
    taken, written = store.RunStore.append, store.RunStore.flush
    monkeypatch.setattr(store.RunStore, "append", lambda self, s: (events.append("taken"), taken(self, s))[1])
    monkeypatch.setattr(store.RunStore, "flush", lambda self: (self._pending and events.append(
        f"written {len(self._pending)}"), written(self))[1])
    server = fake_server("--delay", "0.6")
    m = run(tmp_path, server, suite(tmp_path, [{"id": str(i), "prompt": f"p {i}"} for i in range(3)]), concurrency=1)
    assert events == ["taken", "written 1"] * 3
    assert len(load_samples(tmp_path / "results" / m.run_id)) == 3
