"""Test helpers: start the fake OpenAI-compatible server (tests/fakeserver.py) or a raw loopback one whose
connections a test controls, write suites and configs."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, TypeVar

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


def _ok_answer(body: dict) -> dict:
    return {"choices": [{"index": 0, "text": " ok " + body["prompt"], "finish_reason": "stop", "logprobs": None}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2}}


class LoopbackServer:
    """A raw HTTP/1.1 completions server on loopback whose connections the test controls.
    `close="reused"`: a completion request on a connection that already served one is met by a
    close, unanswered (what a server's keep-alive timeout looks like to a client that reuses the
    connection); `close="always"`: every one is; "reset-reused" and "reset": the same with a TCP
    reset instead of a clean close; `gated`: answers wait for `release()`. `answer`:
    the completion's body for a request body (default: " ok " + its prompt); `drip`: the answer's
    headers go at once, its body one byte every `drip` seconds (a server that never quite stalls)."""

    def __init__(self, close: str | None = None, gated: bool = False,
                 answer: Callable[[dict], dict] | None = None, drip: float | None = None) -> None:
        self.close, self.posts, self.closed = close, 0, 0
        self.answer, self.drip = answer or _ok_answer, drip
        self._ready, self._open = threading.Event(), threading.Event()
        if not gated:
            self._open.set()
        threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True).start()
        assert self._ready.wait(10)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def release(self) -> None:
        self._open.set()

    async def _main(self):
        server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await server.serve_forever()

    async def _conn(self, reader, writer):
        served = 0
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                method, path, _ = head.split("\r\n", 1)[0].split(" ", 2)
                length = next((int(h.split(":", 1)[1]) for h in head.split("\r\n")
                               if h.lower().startswith("content-length:")), 0)
                body = json.loads(await reader.readexactly(length)) if length else {}
                if method == "POST" and path == "/v1/completions":
                    self.posts += 1
                    if self.close in ("always", "reset") or (self.close in ("reused", "reset-reused") and served):
                        self.closed += 1
                        if self.close.startswith("reset"):  # a TCP reset (SO_LINGER 0), not a clean close
                            sock = writer.get_extra_info("socket")
                            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                            writer.transport.abort()
                        else:
                            writer.close()
                        return
                    served += 1
                    while not self._open.is_set():
                        await asyncio.sleep(0.02)
                    status, data = 200, self.answer(body)
                elif path == "/v1/models":
                    status, data = 200, {"object": "list", "data": [{"id": "m", "object": "model"}]}
                else:
                    status, data = 404, {"error": "not found"}
                raw = json.dumps(data).encode()
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(raw)}\r\n\r\n".encode())
                drip = self.drip if path == "/v1/completions" else None
                for part in [raw[i:i + 1] for i in range(len(raw))] if drip else [raw]:
                    writer.write(part)
                    await writer.drain()
                    if drip:
                        await asyncio.sleep(drip)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
