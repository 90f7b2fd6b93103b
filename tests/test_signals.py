"""SIGTERM and SIGHUP stop kvqual as Ctrl-C does: launched servers stopped, port free, answers kept,
exit 128 + the signal within seconds; `kvqual serve` itself shuts down promptly on SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from kvtest import FAKE, free_port, write_suite
from kvqual.launch import port_is_free


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as for a background job of a non-interactive shell


def _start_compare(tmp_path: Path, preexec=None) -> tuple[subprocess.Popen, int]:
    """`kvqual compare a b` with `a` launched (a fake at 0.5 s a request, 2 at a time: ~50 s of
    work); returns once `a` is healthy and answering, with the launched server's port."""
    write_suite(tmp_path / "s.jsonl", [{"id": f"q{i}", "prompt": f"Q{i} [[answer={i}]]"} for i in range(200)])
    py = sys.executable
    (tmp_path / "kvqual.toml").write_text(
        f'[run]\nconcurrency = 2\n[targets.a]\nbase_url = "http://127.0.0.1:{{port}}/v1"\n'
        f'launch = "{py} {FAKE} --port {{port}} --delay 0.5"\n[targets.b]\nbase_url = "http://127.0.0.1:1/v1"\n')
    proc = subprocess.Popen([py, "-m", "kvqual", "compare", "a", "b", "--suite", "s.jsonl"], cwd=tmp_path,
                            env={**os.environ, "CI": "true"}, stderr=subprocess.PIPE, text=True,
                            preexec_fn=preexec)
    port = int(proc.stderr.readline().split("--port ")[1].split()[0])
    deadline = time.monotonic() + 60
    while "healthy" not in proc.stderr.readline() and time.monotonic() < deadline:
        pass
    samples = tmp_path / "results"
    while time.monotonic() < deadline:  # mid-run: some answers are on disk
        files = list(samples.glob("a-*/samples.jsonl"))
        if files and files[0].read_text().count("\n") >= 2:
            break
        time.sleep(0.1)
    return proc, port


@pytest.mark.parametrize("sig, preexec", [(signal.SIGTERM, None), (signal.SIGHUP, None),
                                          (signal.SIGTERM, _ignore_sigint)],
                         ids=["SIGTERM", "SIGHUP", "SIGTERM-with-SIGINT-ignored"])
def test_stop_signal_mid_compare_stops_the_launched_server_and_keeps_answers(tmp_path, sig, preexec):
    proc, port = _start_compare(tmp_path, preexec)
    answered_before = (next((tmp_path / "results").glob("a-*")) / "samples.jsonl").read_text().count("\n")
    t0 = time.monotonic()
    proc.send_signal(sig)
    rest = proc.communicate(timeout=30)[1]
    took = time.monotonic() - t0
    assert proc.returncode == 128 + sig, rest
    assert took < 5, f"exit took {took:.1f} s"
    assert "stopping a" in rest and f"stopped by {signal.Signals(sig).name}" in rest and "saved" in rest
    assert port_is_free(port)
    leftover = subprocess.run(["pgrep", "-f", f"{FAKE} --port {port} "], capture_output=True, text=True)
    assert not leftover.stdout.split(), f"the launched server outlived {signal.Signals(sig).name}"
    lines = (next((tmp_path / "results").glob("a-*")) / "samples.jsonl").read_text().splitlines()
    assert answered_before <= len(lines) < 200  # what was answered before the signal is kept for the resume


def test_a_launched_server_that_ignores_sigterm_is_killed_after_the_short_grace(tmp_path):
    """Stopped while its server starts (it never becomes healthy, and ignores SIGTERM): kvqual
    still exits within seconds, its server killed after INTERRUPT_GRACE_S, not GRACE_S."""
    from kvqual.launch import GRACE_S, INTERRUPT_GRACE_S

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    (tmp_path / "kvqual.toml").write_text(
        f'[targets.a]\nbase_url = "http://127.0.0.1:{{port}}/v1"\nlaunch = "{sys.executable} -c \'{stubborn}\'"\n')
    write_suite(tmp_path / "s.jsonl", [{"id": "a", "prompt": "x"}])
    proc = subprocess.Popen([sys.executable, "-m", "kvqual", "run", "a", "--suite", "s.jsonl"], cwd=tmp_path,
                            env={**os.environ, "CI": "true"}, stderr=subprocess.PIPE, text=True)
    assert "starting a" in proc.stderr.readline()
    time.sleep(1.0)  # the server process is up (and has set SIG_IGN)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=60)[1]
    took = time.monotonic() - t0
    assert proc.returncode == 143, rest
    assert INTERRUPT_GRACE_S <= took < INTERRUPT_GRACE_S + 2 < GRACE_S
    leftover = subprocess.run(["pgrep", "-f", "SIG_IGN; time.sleep"], capture_output=True, text=True)
    assert not leftover.stdout.split(), "the launched server that ignores SIGTERM outlived kvqual"


def test_reference_server_stops_its_engine_on_a_stop_signal():
    """uvicorn alone waits for requests in flight (a long generation) until SIGKILL; kvqual serve
    stops the engine, which fails them at once, and cancels what is left after a short grace."""
    import uvicorn

    from kvqual.serve import server

    class Engine:
        stopped = threading.Event()

        def shutdown(self) -> None:
            self.stopped.set()

    engine = Engine()
    config = uvicorn.Config(lambda *a: None, timeout_graceful_shutdown=server.SHUTDOWN_GRACE_S)
    srv = server._Server(config, engine)  # noqa: SLF001 - the class under test
    srv.handle_exit(signal.SIGTERM, None)
    assert srv.should_exit and engine.stopped.wait(5)
    assert 0 < server.SHUTDOWN_GRACE_S <= 5


@pytest.mark.slow
def test_kvqual_serve_exits_promptly_on_sigterm_with_a_generation_in_flight(tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kvqual", "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, "kvqual serve exited while starting"
                time.sleep(0.5)
        counting = ", ".join(str(i) for i in range(1, 40))  # greedy decoding keeps counting: no early EOS
        body = json.dumps({"prompt": counting + ",", "max_tokens": 2000, "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        finished = threading.Event()
        threading.Thread(target=lambda: _swallow(lambda: urllib.request.urlopen(request, timeout=120).read(),
                                                 finished), daemon=True).start()
        time.sleep(3)
        assert not finished.is_set(), "the request ended early: nothing was in flight"  # ~90 s at 22 tok/s
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        assert time.monotonic() - t0 < 8, "kvqual serve held its shutdown open for the request in flight"
        assert port_is_free(port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _swallow(call, finished: threading.Event) -> None:
    try:
        call()
    except OSError:  # the server failed it (500) or went away: what a stop signal should do
        pass
    finally:
        finished.set()
