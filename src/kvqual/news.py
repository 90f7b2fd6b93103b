"""kvqual's own news on stderr: one `kvqual: ...` line, beside whatever progress display runs."""

from __future__ import annotations

import contextlib
import sys


def say(message: str) -> None:
    """One line on stderr; a terminal that hung up (SIGHUP) must not stop what is being done, such
    as stopping a launched server."""
    with contextlib.suppress(OSError):
        print(f"kvqual: {message}", file=sys.stderr, flush=True)
