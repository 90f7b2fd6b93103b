"""Launched targets: started one at a time, healthy before use, stopped after (ports free)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from kvtest import FAKE, sigint_as_at_a_terminal, write_suite
from kvqual.launch import port_is_free


def test_compare_launches_each_target_in_turn_and_stops_it(tmp_path):
    write_suite(tmp_path / "s.jsonl", [{"id": f"q{i}", "prompt": f"Q{i} [[answer={i}]]", "answer": str(i)}
                                       for i in range(30)])
    py = sys.executable
    (tmp_path / "kvqual.toml").write_text(
        f'[targets.a]\nbase_url = "http://127.0.0.1:{{port}}/v1"\nkv_cache_dtype = "bf16"\n'
        f'launch = "{py} {FAKE} --port {{port}} --kv-cache-dtype bf16"\n'
        f'[targets.b]\nbase_url = "http://127.0.0.1:{{port}}/v1"\nkv_cache_dtype = "fp8_e4m3"\n'
        f'launch = "{py} {FAKE} --port {{port}} --kv-cache-dtype fp8_e4m3"\n')
    r = subprocess.run([py, "-m", "kvqual", "compare", "a", "b", "--suite", "s.jsonl"], cwd=tmp_path,
                       env={**os.environ, "CI": "true"}, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 3), r.stdout + r.stderr
    events = [l for l in r.stderr.splitlines() if l.startswith(("kvqual: starting ", "kvqual: stopping "))]
    assert [e.split()[1] for e in events] == ["starting", "stopping", "starting", "stopping"]
    assert "a:" in events[0] and "b:" in events[2]
    ports = [int(l.split("--port ")[1].split()[0]) for l in events if "starting" in l]
    assert all(port_is_free(p) for p in ports)
    for port in ports:
        leftover = subprocess.run(["pgrep", "-f", f"{FAKE} --port {port} "], capture_output=True, text=True)
        assert not leftover.stdout.split(), f"a launched server on port {port} outlived the comparison"
    report = json.loads(next((tmp_path / "results").glob("compare-*/report.json")).read_text())
    assert report["runs"]["baseline"]["reported_kv_dtype"] == "bf16"
    assert report["runs"]["candidate"]["reported_kv_dtype"] == "fp8_e4m3"
    assert len(list((tmp_path / "results" / "launch-logs").glob("*.log"))) == 2  # output captured


def test_launch_that_dies_is_an_infrastructure_error(tmp_path):
    write_suite(tmp_path / "s.jsonl", [{"id": "a", "prompt": "x"}])
    (tmp_path / "kvqual.toml").write_text(
        f'[targets.a]\nbase_url = "http://127.0.0.1:{{port}}/v1"\nlaunch = "{sys.executable} -c \'raise SystemExit(3)\'"\n')
    r = subprocess.run([sys.executable, "-m", "kvqual", "run", "a", "--suite", "s.jsonl"], cwd=tmp_path,
                       env={**os.environ, "CI": "true"}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 4 and "exited with code 3" in r.stderr


def test_ctrl_c_during_a_comparison_stops_the_launched_server(tmp_path):
    import signal
    import time

    write_suite(tmp_path / "s.jsonl", [{"id": f"q{i}", "prompt": f"Q{i} [[answer={i}]]"} for i in range(200)])
    py = sys.executable
    (tmp_path / "kvqual.toml").write_text(  # 0.5 s per request, 2 at a time: the run takes ~50 s
        f'[run]\nconcurrency = 2\n[targets.a]\nbase_url = "http://127.0.0.1:{{port}}/v1"\n'
        f'launch = "{py} {FAKE} --port {{port}} --delay 0.5"\n[targets.b]\nbase_url = "http://127.0.0.1:1/v1"\n')
    proc = subprocess.Popen([py, "-m", "kvqual", "compare", "a", "b", "--suite", "s.jsonl"], cwd=tmp_path,
                            env={**os.environ, "CI": "true"}, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_as_at_a_terminal)
    started = proc.stderr.readline()
    port = int(started.split("--port ")[1].split()[0])
    deadline = time.monotonic() + 60
    while "healthy" not in proc.stderr.readline() and time.monotonic() < deadline:
        pass
    while time.monotonic() < deadline:  # mid-run: an answer is on disk (a fixed sleep is flaky on a busy box)
        files = list((tmp_path / "results").glob("a-*/samples.jsonl"))
        if files and files[0].read_text().strip():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130, rest
    assert "stopping a" in rest and "saved" in rest
    assert port_is_free(port)
    leftover = subprocess.run(["pgrep", "-f", f"{FAKE} --port {port} "], capture_output=True, text=True)
    assert not leftover.stdout.split(), "the launched server outlived Ctrl-C"
    answered = (next((tmp_path / "results").glob("a-*")) / "samples.jsonl").read_text().splitlines()
    assert 0 < len(answered) < 200  # what was answered before Ctrl-C is kept for the resume


def test_the_watchdog_writes_the_log_scrubbed_as_lines_arrive(tmp_path):
    """Engines log their arguments (vLLM: `api_key=[...]`); the log kept under results/ must not, at
    any moment: the watchdog scrubs each line before it reaches the disk."""
    read_end, write_end = os.pipe()
    log = tmp_path / "a.log"
    keeper = subprocess.Popen([sys.executable, "-m", "kvqual.watchdog", "--pgid", "999999999", "--fd", str(read_end),
                               "--log", str(log), "--grace", "1"], stdin=subprocess.PIPE, pass_fds=(read_end,))
    os.close(read_end)
    keeper.stdin.write(json.dumps({"secrets": ["sk-launch-log-0123456789"]}).encode() + b"\n")
    keeper.stdin.flush()
    os.write(write_end, b"INFO args: api_key=['sk-launch-log-0123456789'] \xff\n")
    os.write(write_end, b"ready\n")
    os.close(write_end)
    keeper.stdin.close()
    assert keeper.wait(timeout=30) == 0
    assert log.read_bytes() == b"INFO args: api_key=['***'] \xff\nready\n"  # other bytes kept as they were


def test_kill_9_leaves_no_launched_server_and_no_key_on_disk(tmp_path):
    """kvqual killed outright (a CI runner's SIGKILL) mid-run: its watchdog stops the launched server,
    and neither the launch log nor any file under results/ holds the configured key."""
    import signal
    import time

    key = "sk-kill9-secret-0123456789"
    write_suite(tmp_path / "s.jsonl", [{"id": f"q{i}", "prompt": f"Q{i} [[answer={i}]]"} for i in range(200)])
    py = sys.executable
    (tmp_path / "kvqual.toml").write_text(  # the launch command logs the key, as engines log their arguments
        f'[run]\nconcurrency = 2\n[targets.a]\nbase_url = "http://127.0.0.1:{{port}}/v1"\napi_key_env = "KVQ_KILL9_KEY"\n'
        f'launch = "sh -c \'echo api_key={key}; exec {py} {FAKE} --port {{port}} --delay 0.5\'"\n'
        f'[targets.b]\nbase_url = "http://127.0.0.1:1/v1"\n')
    proc = subprocess.Popen([py, "-m", "kvqual", "compare", "a", "b", "--suite", "s.jsonl"], cwd=tmp_path,
                            env={**os.environ, "CI": "true", "KVQ_KILL9_KEY": key}, stderr=subprocess.PIPE, text=True)
    started = proc.stderr.readline()
    assert key not in started  # the "starting" line is scrubbed too
    port = int(started.split("--port ")[1].split()[0])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # mid-run: an answer is on disk
        files = list((tmp_path / "results").glob("a-*/samples.jsonl"))
        if files and files[0].read_text().strip():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    def left() -> list[str]:
        return subprocess.run(["pgrep", "-f", f"{FAKE} --port {port}"], capture_output=True, text=True).stdout.split()

    deadline = time.monotonic() + 40  # the watchdog's SIGTERM, then the server's own shutdown
    while time.monotonic() < deadline and (left() or not port_is_free(port)):
        time.sleep(0.2)
    assert not left() and port_is_free(port), "the launched server outlived kill -9"
    logs = list((tmp_path / "results" / "launch-logs").glob("a-*.log"))
    assert logs and "api_key=***" in logs[0].read_text()  # the line was written, scrubbed
    leaks = [str(p) for p in (tmp_path / "results").rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert not leaks, leaks
