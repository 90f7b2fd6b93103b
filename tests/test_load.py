"""`kvqual load`: the statistics against hand-computed values, and whole loads against fake servers
of a known capacity (tests/fakeserver.py --max-running N: N generate at once, the rest queue; each
token --token-delay d apart, so a saturated server makes N / d tokens/s)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kvtest import FAKE, sigint_as_at_a_terminal, write_config, write_suite
from kvqual.cli import main
from kvqual.load import stats
from kvqual.load.session import default_concurrency
from kvqual.load.summary import new_results_dir
from kvqual.records import Item

# ---------------------------------------------------------------- statistics (pure)


def test_batch_means_ci_is_the_t_interval_of_the_batch_means():
    e = stats.batch_means_ci([1, 2, 3, 4, 5])
    # mean 3, s = sqrt(2.5), t(0.975, 4) = 2.776445: half-width 2.776445 * 1.581139 / sqrt(5) = 1.963243
    assert e.estimate == 3 and e.df == 4 and e.n == 5
    assert e.low == pytest.approx(3 - 1.963243, abs=1e-6) and e.high == pytest.approx(3 + 1.963243, abs=1e-6)
    one = stats.batch_means_ci([7.0])
    assert one.estimate == 7 and one.low is None and one.high is None


def test_fieller_ratio_ci_against_hand_computed_values():
    x, y = [10, 12, 11, 9, 13], [20, 24, 22, 18, 26]
    # x̄ 11, v_x = 2.5/5 = 0.5; ȳ 22, v_y = 10/5 = 2; R̂ 2; var(ȳ − R̂x̄) = 2 + 4·0.5 = 4;
    # Welch df = 16 / (2²/4 + 2²/4) = 8; t(0.975, 8) = 2.306004135
    t = 2.306004135
    a = 121 - t**2 * 0.5
    root = math.sqrt(t**2 * (121 * 2 + 484 * 0.5 - t**2 * 0.5 * 2))
    e = stats.fieller_ratio_ci(x, y)
    assert e.estimate == 2 and e.df == pytest.approx(8)
    assert e.low == pytest.approx((242 - root) / a, rel=1e-8) and e.high == pytest.approx((242 + root) / a, rel=1e-8)
    assert e.low == pytest.approx(1.61860, abs=1e-4) and e.high == pytest.approx(2.47124, abs=1e-4)
    for bound in (e.low, e.high):  # each bound solves Fieller's equation (ȳ − R x̄)² = t² (v_y + R² v_x)
        assert (22 - bound * 11) ** 2 == pytest.approx(t**2 * (2 + bound**2 * 0.5), rel=1e-8)
    # asymmetric around R̂ (wider above), and close to the delta method's log-scale interval
    assert e.high - 2 > 2 - e.low
    se_log = math.sqrt(2 / 22**2 + 0.5 / 11**2)
    assert e.low == pytest.approx(2 * math.exp(-t * se_log), rel=0.02)


def test_fieller_ratio_ci_unbounded_when_the_baseline_is_not_above_zero():
    e = stats.fieller_ratio_ci([1.0, -1.0, 2.0], [5.0, 6.0, 7.0])
    assert e.low is None and e.high is None and e.estimate == pytest.approx(6 / (2 / 3))


def test_fieller_ratio_ci_covers_the_true_ratio_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(2000):  # binomial SE at 95 %: 0.5 points
        x, y = rng.normal(100, 8, 8), rng.normal(200, 12, 6)
        e = stats.fieller_ratio_ci(x, y)
        hits += e.low <= 2.0 <= e.high
    assert 0.935 <= hits / 2000 <= 0.965


def test_tokens_in_window_spreads_tokens_between_the_first_and_last():
    # one request: token 1 at t=1, the other 4 evenly over (1, 3]
    f, l, n = [1.0], [3.0], [5]
    assert stats.tokens_in_window(f, l, n, 0, 2)[0] == pytest.approx(3)
    assert stats.tokens_in_window(f, l, n, 2, 10)[0] == pytest.approx(2)
    assert stats.tokens_in_window(f, l, n, 1, 1.5)[0] == pytest.approx(2)
    assert stats.tokens_in_window(f, l, n, 0, 10)[0] == pytest.approx(5)
    # all at once (last == first), one token, none
    assert list(stats.tokens_in_window([2, 2, 2], [2, 2, 2], [3, 1, 0], 2, 3)) == [3, 1, 0]
    assert list(stats.tokens_in_window([2, 2], [2, 2], [3, 1], 0, 2)) == [0, 0]


def test_batch_rates_count_tokens_where_generated_and_requests_where_they_end():
    tok, req = stats.batch_rates([0.0, 1.0], [2.0, 3.0], [5, 3], [2.0, 3.0], [True, True], 0, 4, 2)
    # request 1: 1 at 0, 4 over (0, 2] → 5 in [0, 2); request 2: 1 at 1 + 2 over (1, 3] → 2 in [0, 2), 1 in [2, 4)
    assert list(tok) == pytest.approx([7 / 2, 1 / 2]) and list(req) == pytest.approx([0, 1.0])


def test_time_weighted_mean_holds_each_reading_until_the_next():
    # [0.5, 1) at 2, [1, 3) at 4, [3, 4] at 6: (1 + 8 + 6) / 3.5
    assert stats.time_weighted_mean([0, 1, 3], [2, 4, 6], 0.5, 4) == pytest.approx(15 / 3.5)
    assert stats.time_weighted_mean([1, 2], [5, 7], 0, 3) == pytest.approx(6)  # before the first: unknown
    assert stats.time_weighted_mean([5], [1], 0, 3) is None
    assert stats.counter_rate([0, 2, 4], [0, 10, 30], 1, 3) == pytest.approx((20 - 5) / 2)
    assert stats.counter_rate([0, 2, 4], [0, 10, 3], 1, 3) is None  # went down: the server restarted


def test_warmup_rule_and_batch_count():
    assert stats.warmup_seconds(100, [4, 5, 6]) == 10  # 10 % of the run beats 2 × 5
    assert stats.warmup_seconds(100, [10, 20, 30]) == 40  # 2 × the median generation time
    assert stats.warmup_seconds(100, []) == 10
    assert stats.batch_count(60, 7) == 8 and stats.batch_count(60, 3) == 10 and stats.batch_count(5, 7) == 0


def test_default_concurrency_is_three_times_what_the_kv_cache_holds():
    items = tuple(Item(id=str(i), suite="s", prompt="x" * 40) for i in range(3))  # 10 tokens each
    concurrency, why = default_concurrency(120, items, 20)  # 120 / (10 + 20) = 4 requests
    assert concurrency == 12 and "3 × the 4 requests" in why
    assert default_concurrency(None, items, 20)[0] == 64
    assert default_concurrency(10, items, 20)[0] == 3  # holds less than one: one


def test_a_results_folder_is_never_reused(tmp_path):
    a = new_results_dir(tmp_path, ["bf16", "fp8"], now=0)
    b = new_results_dir(tmp_path, ["bf16", "fp8"], now=0)
    assert a != b and a.name.startswith("load-bf16-vs-fp8-") and b.name == f"{a.name}-2"


# ---------------------------------------------------------------- whole loads on fake servers

TOKEN_DELAY, ANSWER_TOKENS = 0.05, 20  # a request generates for 1 s; a slot makes 20 tok/s


def _fake(fake_server, max_running: int, *extra: str):
    return fake_server("--max-running", str(max_running), "--token-delay", str(TOKEN_DELAY),
                       "--answer-tokens", str(ANSWER_TOKENS), "--token-jitter", "0.5", "--metrics", *extra)


def _suite(tmp_path: Path, n: int = 12, text: str = "") -> Path:
    # prompts of 40 characters: ~10 tokens each by the chars/4 estimate
    return write_suite(tmp_path / "s.jsonl", [{"id": f"p{i}", "prompt": f"{text}prompt {i:02d} ".ljust(40, "x")}
                                               for i in range(n)])


def _load(tmp_path: Path, *args: str) -> tuple[int, dict | None]:
    code = main(["load", *args, "--config", str(tmp_path / "kvqual.toml"), "--suite", str(tmp_path / "s.jsonl"),
                 "--out", str(tmp_path / "results"), "--max-tokens", str(ANSWER_TOKENS)])
    found = sorted((tmp_path / "results").glob("load-*/load.json"))
    return code, json.loads(found[-1].read_text()) if found else None


def test_load_discards_the_warmup_burst_and_measures_the_known_steady_throughput(tmp_path, fake_server, capsys):
    """4 slots at 20 tok/s each: 80 tok/s once saturated; for its first 0.5 s the server admits all
    12 (an empty KV cache), a burst at 3x that the warm-up rule must drop."""
    server = _fake(fake_server, 4, "--kv-capacity-tokens", "120", "--burst-s", "0.5")
    write_config(tmp_path / "kvqual.toml", {"a": server.base_url})
    _suite(tmp_path)
    code, doc = _load(tmp_path, "a", "--duration", "8", "--concurrency", "12")
    assert code == 0, capsys.readouterr().err
    arm = doc["arms"][0]
    w, tok = arm["window"], arm["output_tok_s"]
    assert w["generation_time_p50_s"] == pytest.approx(1.0, rel=0.15)
    # both figures are rounded in load.json (3 decimals): twice the rounded median is off by up to 1e-3,
    # the rounded warm-up by 5e-4 more
    assert w["warmup_s"] == pytest.approx(max(2 * w["generation_time_p50_s"], 0.8), abs=2e-3)
    assert w["batches"] >= 5 and w["end_s"] == 8
    known = 4 / TOKEN_DELAY
    assert tok["low"] < tok["estimate"] < tok["high"]
    assert abs(tok["estimate"] / known - 1) < 0.08 and tok["low"] * 0.95 <= known <= tok["high"] * 1.05
    # the discarded part ran faster: counting it would have biased the figure up
    rows = [json.loads(line) for line in next((tmp_path / "results").glob("load-*/requests.jsonl")).open()]
    ok = [r for r in rows if r["error"] is None]
    assert len(rows) == arm["requests"]["sent"] and all(r["completion_tokens"] == ANSWER_TOKENS for r in ok)
    burst = stats.tokens_in_window([r["first_token_s"] for r in ok], [r["last_token_s"] for r in ok],
                                   [r["completion_tokens"] for r in ok], 0, 1.0).sum()
    assert burst > 2 * known * 1.0
    # the server's own figures: 4 running, the other 8 queued, KV full; its capacity from probe
    s = arm["server"]
    assert s["running_mean"] == pytest.approx(4, abs=0.5) and s["waiting_mean"] == pytest.approx(8, abs=1)
    assert s["waiting_mean"] > 0 and arm["saturated"] is True and s["kv_usage_mean"] == pytest.approx(1, abs=0.12)
    assert arm["kv_capacity_tokens"] == 120 and arm["concurrency"] == 12
    # latencies of the steady window only; TTFT includes the queue (2 requests' worth)
    assert arm["ttft_s"]["n"] == w["requests_started"] < len(ok)
    assert arm["ttft_s"]["p50"] == pytest.approx(2.0, rel=0.3)
    assert arm["itl_s"]["p50"] == pytest.approx(TOKEN_DELAY, rel=0.2)
    assert arm["requests"]["failed"] == 0 and arm["completion_tokens"]["mean"] == ANSWER_TOKENS
    out = capsys.readouterr().out
    assert "output tok/s" in out and "running / queued" in out and "load.json" in out


def test_two_targets_give_the_capacity_ratio_and_the_concurrency_each_sustained(tmp_path, fake_server, capsys):
    """A candidate with twice the capacity (8 slots against 4) at a load above both: ratio 2.
    The concurrency is derived from the baseline's KV capacity: 120 tokens / (10 + 20) = 4 → 12."""
    base = _fake(fake_server, 4, "--kv-capacity-tokens", "120")
    cand = _fake(fake_server, 8, "--kv-capacity-tokens", "240")
    write_config(tmp_path / "kvqual.toml", {"base": base.base_url, "cand": cand.base_url})
    _suite(tmp_path)
    code, doc = _load(tmp_path, "base", "cand", "--duration", "7")
    assert code == 0, capsys.readouterr().err
    assert doc["status"] == "complete" and doc["params"]["concurrency"] == 12
    assert "3 × the 4 requests" in doc["params"]["concurrency_source"]
    b, c = doc["arms"]
    assert b["concurrency"] == c["concurrency"] == 12
    # what `compare --speed-from` checks: the targets as configured (no port, no secret)
    assert c["identity"] == {"name": "cand", "base_urls": [cand.base_url], "model": None, "launch": None,
                             "kv_cache_dtype": None}
    ratio = doc["ratio"]
    assert ratio["estimate"] == pytest.approx(2.0, rel=0.08)
    assert ratio["low"] <= 2.0 <= ratio["high"] and ratio["high"] - ratio["low"] < 0.6
    again = stats.fieller_ratio_ci(b["output_tok_s"]["batches"], c["output_tok_s"]["batches"])
    assert ratio["estimate"] == pytest.approx(again.estimate, abs=1e-3) and ratio["low"] == pytest.approx(again.low, abs=1e-3)
    run = ratio["sustained_running"]
    assert run["baseline"] == pytest.approx(4, abs=0.5) and run["candidate"] == pytest.approx(8, abs=0.8)
    assert c["server"]["waiting_mean"] > 1 and c["saturated"] is True
    assert "cand/base steady output tok/s" in capsys.readouterr().out


def test_a_server_that_reports_auto_is_sized_by_the_configured_kv_dtype_as_compare_does(tmp_path, fake_server, capsys):
    """vLLM reports a bf16 KV cache as "auto" (the model's dtype, which it does not name). On an H100
    (2026-12-07) `kvqual load bf16 fp8` printed "×2; the KV dtypes' sizes are unknown" where `compare`
    of the same servers split it: load now sizes a token by the configured KV dtype first, as the judge."""
    base = _fake(fake_server, 4, "--kv-capacity-tokens", "120", "--kv-cache-dtype", "auto")
    cand = _fake(fake_server, 8, "--kv-capacity-tokens", "240", "--kv-cache-dtype", "fp8")
    (tmp_path / "kvqual.toml").write_text(f'[targets.base]\nbase_url = "{base.base_url}"\nkv_cache_dtype = "bf16"\n'
                                          f'[targets.cand]\nbase_url = "{cand.base_url}"\nkv_cache_dtype = "fp8"\n')
    _suite(tmp_path)
    code, doc = _load(tmp_path, "base", "cand", "--duration", "4")
    assert code == 0, capsys.readouterr().err
    b, c = doc["arms"]
    assert b["kv_cache_dtype"] == {"expected": "bf16", "reported": "auto"} and b["kv_size_dtype"] == "bf16"
    cap = doc["ratio"]["capacity"]
    assert cap["dtype_share"] == 2 and cap["memory_share"] == 1 and cap["same_budget"] is True
    assert "(×2: the KV dtype, bf16 → fp8, 2 → 1 bytes a value)" in " ".join(capsys.readouterr().out.split())


def test_failed_requests_are_failures_never_answers_and_too_many_is_exit_4(tmp_path, fake_server, capsys):
    server = fake_server("--token-delay", "0.01", "--answer-tokens", "5")
    write_config(tmp_path / "kvqual.toml", {"a": server.base_url})
    write_suite(tmp_path / "s.jsonl", [{"id": f"p{i}", "prompt": f"p{i}" + (" broken" if i < 3 else "")}
                                       for i in range(10)])
    code, doc = _load(tmp_path, "a", "--duration", "2", "--concurrency", "4")
    assert code == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "requests failed under load" in err[0] and "HTTP 500" in err[0]
    arm = doc["arms"][0]
    assert doc["status"] == "failed" and arm["requests"]["failed"] > 0
    rows = [json.loads(line) for line in next((tmp_path / "results").glob("load-*/requests.jsonl")).open()]
    failed = [r for r in rows if r["error"] is not None]
    assert len(failed) == arm["requests"]["failed"] and all("broken" not in r["id"] for r in rows)
    assert all(r["completion_tokens"] is None and r["first_token_s"] is None for r in failed)
    assert {r["id"] for r in failed} <= {"p0", "p1", "p2"}
    assert arm["requests"]["answered"] == len(rows) - len(failed)


@pytest.mark.parametrize("args, message", [
    (["nope"], "targets.nope: no such target"),
    (["a", "--duration", "0"], "--duration must be > 0"),
    (["a", "--duration", "-3"], "--duration must be > 0"),
    (["a", "--duration", "5", "--warmup", "5"], "--warmup must be"),
    (["a", "a", "a"], "one or two targets"),
    (["a", "--concurrency", "0"], "--concurrency: must be at least 1"),
])
def test_bad_input_is_exit_2_with_one_line(tmp_path, capsys, args, message):
    write_config(tmp_path / "kvqual.toml", {"a": "http://127.0.0.1:9/v1"})
    _suite(tmp_path)
    code, doc = _load(tmp_path, *args)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert doc is None  # nothing measured, no results folder


def test_ctrl_c_stops_the_load_and_the_launched_server(tmp_path):
    from kvqual.launch import port_is_free

    py = sys.executable
    (tmp_path / "kvqual.toml").write_text(
        f'[targets.a]\nbase_url = "http://127.0.0.1:{{port}}/v1"\n'
        f'launch = "{py} {FAKE} --port {{port}} --token-delay 0.05 --answer-tokens 20 --max-running 2"\n')
    _suite(tmp_path)
    proc = subprocess.Popen([py, "-m", "kvqual", "load", "a", "--duration", "60", "--suite", "s.jsonl",
                             "--concurrency", "4"], cwd=tmp_path, env={**os.environ, "CI": "true"},
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            preexec_fn=sigint_as_at_a_terminal)
    port = int(proc.stderr.readline().split("--port ")[1].split()[0])
    deadline = time.monotonic() + 60
    while "healthy" not in proc.stderr.readline() and time.monotonic() < deadline:
        pass
    time.sleep(2.0)  # under load
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=30)[1]
    assert proc.returncode == 130, rest
    assert time.monotonic() - t0 < 6 and "stopping a" in rest and "interrupted" in rest
    assert "a load does not resume" in rest and "run the same command to resume" not in rest
    assert port_is_free(port)
    leftover = subprocess.run(["pgrep", "-f", f"{FAKE} --port {port} "], capture_output=True, text=True)
    assert not leftover.stdout.split(), "the launched server outlived Ctrl-C"


def test_load_help_imports_neither_torch_nor_openai():
    code = ("import sys\nfrom kvqual.cli import main\ntry:\n    main(['load', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('IMPORTED', sorted(m for m in ('torch', 'transformers', 'openai') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "--concurrency" in out and "IMPORTED []" in out


def test_an_arm_without_throughput_gives_a_ratio_without_bounds_and_valid_json():
    e = stats.fieller_ratio_ci([0.0, 0.0, 0.0], [5.0, 6.0, 7.0])
    assert e.low is None and json.dumps(e.to_json(), allow_nan=False)


def test_requests_still_queued_after_the_drain_are_cut_off_not_counted_as_failures(tmp_path, fake_server, capsys):
    """2 slots, 10 in flight, 1 s a request: at the end 8 wait. The drain waits 1.5 longest
    generations + 1 s (~2.6 s): the running pair and the next finish, the rest are cancelled."""
    server = _fake(fake_server, 2)
    write_config(tmp_path / "kvqual.toml", {"a": server.base_url})
    _suite(tmp_path)
    code, doc = _load(tmp_path, "a", "--duration", "3", "--concurrency", "10")
    assert code == 0, capsys.readouterr().err
    req, w = doc["arms"][0]["requests"], doc["arms"][0]["window"]
    assert req["failed"] == 0 and req["failed_rate"] == 0 and req["cancelled_at_end"] >= 2
    assert req["sent"] == req["answered"] + req["cancelled_at_end"]
    assert w["drain_s"] < 4.0  # not the 4 more seconds a full drain of the queue would take
    rows = [json.loads(line) for line in next((tmp_path / "results").glob("load-*/requests.jsonl")).open()]
    cut = [r for r in rows if r["cancelled"]]
    assert len(cut) == req["cancelled_at_end"] and all(r["completion_tokens"] is None for r in cut)
