"""The launched server's keeper: its log written with secrets scrubbed as the lines arrive, and the
server stopped when kvqual goes, even by `kill -9`.

`launch.launched` starts the server in a session of its own, then this process, in another session
(a signal to kvqual's process group does not reach it), with the read end of the server's output
pipe and a pipe from kvqual on stdin. Its first stdin line is the secrets to scrub (JSON); after
that stdin stays silent until kvqual closes it, by stopping the server as usual or by dying. At
that end of file the server's process group is sent SIGTERM, then SIGKILL after `--grace`
seconds, and the rest of its output is written before this process exits. A log on disk therefore
never holds a configured key, and no launched server outlives the kvqual that started it.

    python -m kvqual.watchdog --pgid PGID --fd FD --log PATH [--grace S]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time

from kvqual.errors import redact, register_secret


def copy_scrubbed(fd: int, log_path: str) -> None:
    """The server's output, line by line, into the log with every registered secret replaced."""
    with os.fdopen(fd, "rb") as src, open(log_path, "ab") as log:
        for line in src:
            text = line.decode("utf-8", errors="surrogateescape")  # bytes kept as they are
            log.write(redact(text).encode("utf-8", errors="surrogateescape"))
            log.flush()


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(pgid: int, grace: float) -> None:
    """SIGTERM to the group, SIGKILL to what is left after `grace` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvqual.watchdog", description=__doc__.split("\n\n")[0])
    p.add_argument("--pgid", type=int, required=True)
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--grace", type=float, default=10.0)
    args = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is kvqual's to handle, not ours
    first = sys.stdin.buffer.readline()
    with contextlib.suppress(ValueError):
        for secret in json.loads(first or b"{}").get("secrets", []):
            register_secret(secret)
    copier = threading.Thread(target=copy_scrubbed, args=(args.fd, args.log), daemon=True)
    copier.start()
    while sys.stdin.buffer.read(4096):  # kvqual writes nothing more: this returns at its end, or its death
        pass
    if alive(args.pgid):
        stop(args.pgid, args.grace)
    copier.join(timeout=args.grace)  # the output the server wrote before it went
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
