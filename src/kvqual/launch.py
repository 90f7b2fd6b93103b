"""Start a target's server, wait until it really serves, and stop it (process group) after.

The users who need kvqual most run one model on all their GPUs, so the two arms cannot run
side by side: each is start → wait → run → stop, and the next may start only once the
previous server has let go of its port. A launched server never outlives kvqual: on
success or error it gets SIGTERM, then SIGKILL after GRACE_S; when kvqual itself is stopped
(Ctrl-C, SIGTERM, SIGHUP: see cli.py) after INTERRUPT_GRACE_S, so that kvqual exits within
seconds; and when kvqual is killed outright (`kill -9`, a CI runner's SIGKILL), its watchdog
(watchdog.py, a process of its own session) sees kvqual's pipe close and stops the server. The
server's output reaches its log only through the watchdog, with configured keys scrubbed as each
line is written: no log on disk holds a key, whenever kvqual stops.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import AsyncIterator

from kvqual.config import Target
from kvqual.errors import LaunchError, redact, register_secret, registered_secrets
from kvqual.news import say
from kvqual.transport import Transport

GRACE_S = 30.0
INTERRUPT_GRACE_S = 3.0
_live: set[int] = set()  # process-group ids still running, stopped at exit as a last resort


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _port_of(target: Target) -> int | None:
    from urllib.parse import urlparse

    return urlparse(target.base_url).port


def _tail(path: Path, n: int = 8) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-n:] if line.strip())


def stop_group(proc: subprocess.Popen, grace: float = GRACE_S) -> None:
    """SIGTERM to the process group, SIGKILL after `grace` seconds."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait(timeout=30)
    # children that outlived the leader still hold the group: kill what is left
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    _live.discard(pgid)


def _start(target: Target, argv: list[str], log: Path) -> tuple[subprocess.Popen, subprocess.Popen]:
    """The server in a session of its own, its output on a pipe to its watchdog (watchdog.py), which
    writes it to `log` scrubbed (engines log their arguments, keys included) and stops the server
    when kvqual's pipe to it closes, however kvqual ended."""
    read_end, write_end = os.pipe()
    try:
        try:
            proc = subprocess.Popen(argv, stdout=write_end, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"{target.name}: cannot start {argv[0]!r}: {exc}") from None
        _live.add(proc.pid)
        keeper = subprocess.Popen([sys.executable, "-m", "kvqual.watchdog", "--pgid", str(proc.pid),
                                   "--fd", str(read_end), "--log", str(log), "--grace", str(GRACE_S)],
                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=(read_end,),
                                  start_new_session=True)
    finally:
        os.close(write_end)
        os.close(read_end)
    assert keeper.stdin is not None
    keeper.stdin.write(json.dumps({"secrets": registered_secrets()}).encode() + b"\n")
    keeper.stdin.flush()
    return proc, keeper


def _release(keeper: subprocess.Popen) -> None:
    """Tell the watchdog the server is stopped (its pipe closes) and let it write the last lines."""
    with contextlib.suppress(OSError):
        assert keeper.stdin is not None
        keeper.stdin.close()
    try:
        keeper.wait(timeout=GRACE_S + 5)
    except subprocess.TimeoutExpired:
        keeper.kill()


@atexit.register
def _stop_all() -> None:
    for pgid in list(_live):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


async def wait_healthy(target: Target, proc: subprocess.Popen, log: Path, timeout: float) -> float:
    """Poll /health, then send a one-token request; seconds it took. LaunchError on failure. Each
    request is sent once, without retries: the poll, every half second, is what asks again."""
    t0 = time.monotonic()
    last_note = t0
    transport = Transport(target.base_url, target.api_key(), 10.0)
    try:
        while True:
            if proc.poll() is not None:
                raise LaunchError(f"{target.name}: server exited with code {proc.returncode} while starting; "
                                  f"log {log}: {_tail(log)}")
            elapsed = time.monotonic() - t0
            if elapsed > timeout:
                raise LaunchError(f"{target.name}: not healthy after {timeout:.0f} s; log {log}: {_tail(log)}")
            try:
                await transport.send("GET", "/health", at_root=True)
                models = (await transport.get_json("/models"))["data"]
                model = target.model or models[0]["id"]
                await transport.post_json("/completions", {"model": model, "prompt": "Hello", "max_tokens": 1})
                return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - not serving yet (refused, 503, no model listed): poll again
                pass
            if time.monotonic() - last_note > 15:
                say(f"waiting for {target.name} to become healthy… {elapsed:.0f} s")
                last_note = time.monotonic()
            await asyncio.sleep(0.5)
    finally:
        await transport.aclose()


@contextlib.asynccontextmanager
async def launched(target: Target, results_dir: str) -> AsyncIterator[Target]:
    """Start `target.launch` (with `{port}` filled), yield the ready target, always stop it."""
    assert target.launch
    if "{port}" in target.launch or any("{port}" in u for u in target.base_urls):
        target = target.with_port(free_port())
    port = _port_of(target)
    if port is not None and not port_is_free(port):
        raise LaunchError(f"{target.name}: port {port} is already in use; stop what holds it or use {{port}}")
    log_dir = Path(results_dir) / "launch-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{target.name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    argv = shlex.split(target.launch)
    register_secret(target.api_key())  # before anything is printed or logged: engines echo their arguments
    say(redact(f"starting {target.name}: {target.launch}  (log: {log})"))
    proc, keeper = _start(target, argv, log)
    interrupted = False
    try:
        took = await wait_healthy(target, proc, log, target.launch_timeout)
        say(f"{target.name} is healthy after {took:.1f} s at {target.base_url}")
        yield target
    except (asyncio.CancelledError, KeyboardInterrupt):
        interrupted = True
        raise
    finally:
        say(f"stopping {target.name}")
        stop_group(proc, INTERRUPT_GRACE_S if interrupted else GRACE_S)
        _release(keeper)
        if port is not None:
            deadline = time.monotonic() + 15
            while not port_is_free(port):
                if time.monotonic() > deadline:
                    raise LaunchError(f"{target.name}: port {port} still in use after the server stopped")
                await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def serving(target: Target, log_dir: str) -> AsyncIterator[Target]:
    """The target ready to serve: launched by kvqual (and stopped after) when it has `launch`."""
    if not target.launch:
        yield target
        return
    async with launched(target, log_dir) as ready:
        yield ready
