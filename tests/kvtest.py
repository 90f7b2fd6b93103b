"""Test helpers: start the fake OpenAI-compatible server (tests/fakeserver.py), write suites and configs."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

FAKE = Path(__file__).with_name("fakeserver.py")


def sigint_as_at_a_terminal() -> None:
    """A child's preexec_fn for the Ctrl-C tests: SIGINT at its default disposition, as under an
    interactive shell. A test run started as a background job of a non-interactive shell (`cmd &`,
    nohup) has SIGINT ignored, every child inherits that, and Python then installs no
    KeyboardInterrupt handler: the child would never see the Ctrl-C the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    def __init__(self, port: int, proc: subprocess.Popen) -> None:
        self.port, self.proc = port, proc
        self.base_url = f"http://127.0.0.1:{port}/v1"

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/stats", timeout=5) as r:
            return json.load(r)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


S = TypeVar("S", bound=FakeServer)


def start_fake(*flags: str, script: Path = FAKE, kind: type[S] = FakeServer) -> S:  # type: ignore[assignment]
    """Start a fake server process (tests/fakeserver.py, or another `script` taking `--port`) and wait
    until its /health answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script), "--port", str(port), *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
            return kind(port, proc)
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{script.name} exited with {proc.returncode}")
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{script.name} did not start")


def write_suite(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items), encoding="utf-8")
    return path


def write_config(path: Path, targets: dict[str, str], extra: str = "") -> Path:
    """targets: name → base_url."""
    lines = [f'[targets.{name}]\nbase_url = "{url}"\n' for name, url in targets.items()]
    path.write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return path
