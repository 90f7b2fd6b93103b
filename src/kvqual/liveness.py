"""Is a silent server still there? A hung server ends the work in minutes, not after every
request's timeout and retries.

A request's deadline (`[run] timeout`, 600 s) must allow a long generation on a loaded server,
and a timeout is retried (`[run] retries`, 5): a server that stops answering altogether held
each request for 6 × 600 s, about an hour of silence before the first failure was even counted.
Silence alone proves nothing — a long generation is silent too — so after `[run] stall_seconds`
without any answer while requests wait, the server is asked whether it is alive: SGLang's GET
/health_generate (503 unless its scheduler made progress within 20 s; its plain /health answers
200 whatever the scheduler does), else GET /health (vLLM answers it from its engine's state). Any
answer below 500 within PROBE_TIMEOUT is life (a server without either route answers 404: alive). DEAD_AFTER failed asks in a row, PROBE_EVERY apart, and the
work stops as an infrastructure fault (exit 4): what was answered is kept, what was not is asked
again by the next run of the same command.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Sequence, TypeVar

from kvqual.errors import InfrastructureError
from kvqual.retry import classify
from kvqual.transport import Transport, server_root

T = TypeVar("T")

STALL_SECONDS = 120.0  # [run] stall_seconds: no answer for this long while requests wait → ask /health
PROBE_TIMEOUT = 30.0  # SGLang's /health takes up to 20 s when it has to generate a token itself
PROBE_EVERY = 30.0
DEAD_AFTER = 3  # failed asks in a row: ~stall_seconds + 2 × PROBE_EVERY + PROBE_TIMEOUT to exit 4


async def unhealthy(transport: Transport, timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when the server says it is alive within `timeout`; else what happened. SGLang's
    `/health_generate` first: its plain `/health` answers 200 from the HTTP process whatever the
    scheduler does (SGLang 0.5.17, http_server.py), while `/health_generate` answers 503 unless
    the scheduler made progress within 20 s. A server without it (404: vLLM, kvqual serve) is
    asked `/health`, which vLLM answers from its engine's state."""
    import openai

    for path in ("/health_generate", "/health"):
        try:
            await transport.send("GET", path, at_root=True, timeout=timeout)
            return None
        except openai.APIStatusError as exc:
            if exc.status_code in (404, 405) and path == "/health_generate":
                continue  # not SGLang: its /health
            return None if exc.status_code < 500 else f"{path} answered HTTP {exc.status_code}"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure to answer is the evidence
            return f"{path}: {classify(exc).message}"
    return None


class Liveness:
    """Watches one piece of work's requests to `transports`' servers: `answered()` after each
    answer; `guard(work)` runs the work and stops it with an InfrastructureError when the servers
    fall silent and fail DEAD_AFTER health asks in a row."""

    def __init__(self, name: str, transports: Sequence[Transport], stall: float = STALL_SECONDS,
                 every: float = PROBE_EVERY, dead_after: int = DEAD_AFTER, timeout: float = PROBE_TIMEOUT) -> None:
        self.name, self.transports = name, list(transports)
        # a short stall asks sooner and waits less for each answer (PROBE_* are the ceilings)
        self.stall, self.every, self.timeout = stall, min(every, stall / 2), min(timeout, stall / 2)
        self.dead_after = dead_after
        self.last = time.monotonic()

    def answered(self) -> None:
        self.last = time.monotonic()

    async def _dead(self) -> str:
        """Returns (why) once the servers are judged gone; runs until cancelled otherwise."""
        misses, why = 0, ""
        while True:
            await asyncio.sleep(self.every if misses else self.stall / 4)
            silent = time.monotonic() - self.last
            if silent < self.stall:
                misses = 0
                continue
            problems = [(t, w) for t, w in zip(self.transports, await asyncio.gather(
                *(unhealthy(t, self.timeout) for t in self.transports))) if w]
            misses = misses + 1 if problems else 0
            if problems:
                t, why = problems[0]
                if misses >= self.dead_after:
                    return (f"{self.name}: no answer for {time.monotonic() - self.last:.0f} s and the server at "
                            f"{server_root(t.base_url)} did not answer its health check {misses} times in a row "
                            f"({why}): it looks hung or gone; what was answered is kept, run the same command "
                            "again to ask the rest ([run] stall_seconds)")

    async def guard(self, work: Awaitable[T]) -> T:
        """`await work`, unless the servers are judged gone first: then the work is cancelled (and
        awaited, so it closes what it opened) and InfrastructureError raised."""
        self.last = time.monotonic()
        job = asyncio.ensure_future(work)
        if self.stall <= 0:
            return await job
        watch = asyncio.ensure_future(self._dead())
        try:
            await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
            if job.done():
                return job.result()
            job.cancel()
            await asyncio.gather(job, return_exceptions=True)
            raise InfrastructureError(watch.result())
        finally:
            watch.cancel()
            if not job.done():
                job.cancel()
            await asyncio.gather(job, watch, return_exceptions=True)
