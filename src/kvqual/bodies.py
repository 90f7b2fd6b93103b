"""Response bodies: how big one may be, how many bytes all requests may hold at once, and what
counts as JSON. The transport (`transport.py`) reads every body through `read_body`.

Bodies are bounded twice: one body at most `MAX_RESPONSE_BYTES` (a bigger one is `InvalidResponse`,
not read further), and the bodies being read and decoded by every request of the process together
at most `BODY_BUDGET_BYTES` (`BodyBudget`): a request whose next bytes do not fit waits for others'
to be freed, so memory held in bodies stays bounded at any concurrency (the answers decoded from them
are their callers').

Garbage is not data: a body over the cap, a non-finite number (JSON has none) or an answer from
another model than the one asked for raises `InvalidResponse` — one failed request with its reason,
never an answer.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from typing import Any, AsyncIterator, Callable, Mapping

import orjson

from kvqual.errors import InvalidResponse, redact

# One response body (a stream: all its chunks) at most. vLLM's completions logprobs take ~230 bytes a
# token at top-5 and ~750 at top-20, so this holds a 128K-token echo at top-5 or a 64K one at top-20;
# a bigger body is a failed request, and is not read further.
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
# Every body being read or decoded, all requests of the process together: 4 bodies at the cap, or
# thousands of ordinary answers (a 256-token top-5 answer is ~60 KB).
BODY_BUDGET_BYTES = 256 * 1024 * 1024


class BodyBudget:
    """Bytes of response bodies held at once, by every request of the process, at most `total`.
    A request holds what it has read (`Lease.reach`) until it is done (`Lease.release`). So that
    requests never all wait on each other, the oldest holder may always read on (it needs at most
    `cap`, one body), and the others together hold at most `total - cap`: the oldest finishes,
    frees its bytes, and the next oldest takes its place. Not tied to an event loop."""

    def __init__(self, total: int = BODY_BUDGET_BYTES, cap: int = MAX_RESPONSE_BYTES) -> None:
        if total < 2 * cap:
            raise ValueError(f"a body budget of {total} bytes leaves no room beside one body of {cap}")
        self.total, self.cap = total, cap
        self.held = self.peak = 0
        self._holders: dict[Lease, None] = {}  # in the order they first held bytes: the first is the oldest
        self._waiters: list[asyncio.Future[None]] = []

    def lease(self) -> Lease:
        return Lease(self)

    def _fits(self, lease: Lease, more: int) -> bool:
        oldest = next(iter(self._holders), lease)
        if oldest is lease:
            return True  # its body is capped at `cap`, and the others leave it that much
        return self.held - oldest.held + more <= self.total - self.cap

    async def _take(self, lease: Lease, more: int) -> None:
        while not self._fits(lease, more):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self._hold(lease, more)

    def _hold(self, lease: Lease, more: int) -> None:
        if not lease.held:
            self._holders[lease] = None
        lease.held += more
        self.held += more
        if self.held > self.peak:
            self.peak = self.held

    def _give(self, lease: Lease) -> None:
        if not lease.held:
            return
        self.held -= lease.held
        lease.held = 0
        del self._holders[lease]
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:  # each checks again whether it fits now
            if not waiter.done() and not waiter.get_loop().is_closed():
                waiter.set_result(None)


class Lease:
    """One request's bytes in the budget."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: BodyBudget) -> None:
        self.budget, self.held = budget, 0

    def grow(self, size: int) -> bool:
        """Hold `size` bytes in all if that fits now; whether it is held (False: `reach` waits for room)."""
        more = size - self.held
        if more <= 0:
            return True
        if not self.budget._fits(self, more):  # noqa: SLF001 - the budget's own accounting
            return False
        self.budget._hold(self, more)  # noqa: SLF001
        return True

    async def reach(self, size: int) -> None:
        """Hold `size` bytes in all, waiting for room when that is more than fits now."""
        if not self.grow(size):
            await self.budget._take(self, size - self.held)  # noqa: SLF001

    def release(self) -> None:
        self.budget._give(self)  # noqa: SLF001


BUDGET = BodyBudget()  # the process's: every Transport's requests share it


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:20]} overflows to infinity")
    return value


def decode_json(raw: bytes, server: str = "server") -> Any:
    """A response body as JSON; NaN / Infinity (which Python's encoder writes and JSON does not
    have) and numbers that overflow are `InvalidResponse`, as is a body that is not JSON.

    orjson first (5x the standard decoder on a 256 x top-5 answer): it is strict JSON, so it
    refuses NaN, Infinity and every number, integer or not, that is infinite as a double. What
    it refuses goes through the standard decoder with the hooks, which names what is wrong (or
    accepts what is valid JSON to it alone: a UTF-16 body, a lone surrogate escape), so what is
    accepted and every message are those of the standard decoder alone."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidResponse(f"{server}: malformed response: {redact(str(exc))[:200]}") from None


# OpenAI's API answers a model alias with a dated snapshot: gpt-4o → gpt-4o-2024-08-06, gpt-4 → gpt-4-0613
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{4})")


def check_model(requested: Any, data: Any, server: str = "server") -> None:
    """The answer names the model that was asked for (or OpenAI's dated snapshot of it); another
    model's answer is `InvalidResponse`. A body without `model` is taken at its word."""
    returned = data.get("model") if isinstance(data, Mapping) else None
    if not isinstance(requested, str) or not requested or returned in (None, ""):
        return
    if returned == requested or (isinstance(returned, str) and returned.startswith(requested)
                                 and _SNAPSHOT.fullmatch(returned[len(requested):])):
        return
    raise InvalidResponse(f"{server}: answered by model {redact(str(returned))[:100]!r}, "
                          f"not the requested {requested!r}")


def too_big(server: str) -> str:
    """Why a body over the cap failed its request."""
    return f"{server}: response body over {MAX_RESPONSE_BYTES // 2**20} MiB (MAX_RESPONSE_BYTES); not read further"


async def read_body(parts: AsyncIterator[bytes], declared: str | None, lease: Lease, server: str,
                    broke: Callable[[Exception], BaseException]) -> bytes:
    """The body, at most MAX_RESPONSE_BYTES of it (a bigger one is `InvalidResponse`), each part held
    in the budget before it is kept. A body that breaks off raises what `broke` makes of the error."""
    if declared is not None and declared.isdigit():
        if int(declared) > MAX_RESPONSE_BYTES:
            raise InvalidResponse(too_big(server))
        if not lease.grow(int(declared)):  # at once: an ordinary answer asks the budget once
            await lease.reach(int(declared))
    kept: list[bytes] = []
    size = 0
    try:
        async for part in parts:
            size += len(part)
            if size > MAX_RESPONSE_BYTES:
                raise InvalidResponse(too_big(server))
            if size > lease.held and not lease.grow(size):  # more than declared: decompressed as it comes
                await lease.reach(size)
            kept.append(part)
    except InvalidResponse:
        raise
    except Exception as exc:  # noqa: BLE001 - the transport's read errors (httpx2 under the SDK, aiohttp)
        raise broke(exc) from exc
    return b"".join(kept)
