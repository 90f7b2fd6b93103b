"""One retry policy for every request kvqual sends (generation, teacher forcing, probes): which
failures are transient (`classify`), how long to wait before the next attempt (`backoff_delay`, a
server's Retry-After as a floor), and how many attempts a request may spend (`RetryPolicy`).

Retries and reconnects are counted apart. A retry is another attempt after a real failure (a
429, a 5xx, a timeout, a refused connection), with backoff, within `retries`. A reconnect is a
request sent again at once because the server closed the connection before any byte of the
response: what a keep-alive connection the server timed out looks like when it is reused. A clean
close before the response counts as one whichever connection it came on (the SDK's client does not
say whether it was a reused one); a reset, or aiohttp's "Cannot write to closing transport", counts
as one when the transport saw it on a reused connection (`ClosedOnReuse`) — on a fresh connection it
is what a crashed server's socket sends, a failure. Up to MAX_RECONNECTS per request; beyond that
it is a failed attempt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import random
import sys
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Generic, Iterator, Mapping, TypeVar

from kvqual.errors import InvalidResponse, ServerContractError, redact

T = TypeVar("T")

MAX_RECONNECTS = 2  # per request; a server that keeps closing on it is failing, not timing out idle connections
CLOSED_BEFORE_RESPONSE = "connection error: the server closed the connection before responding"
CLOSED_MID_BODY = "connection error: the server closed the connection mid-body, before the whole response arrived"
BROKE_OFF = "response broke off"  # how the transport words a body that stopped coming (`transport.py`)


class ClosedOnReuse(ConnectionError):
    """The server reset or shut a kept-alive connection kvqual reused, before any byte of the
    response (the transport raises it from the connection error it saw): a reconnect, no attempt."""


@dataclass(frozen=True)
class FailureInfo:
    transient: bool
    message: str
    retry_after: float | None = None


@dataclass(frozen=True)
class Sent(Generic[T]):
    """One request under the policy: its value, or why it failed for good (`failure`, and the last
    exception, for callers that tell failures apart); what it cost in attempts and reconnects."""

    value: T | None
    failure: FailureInfo | None
    attempts: int
    reconnects: int
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts, backoff and reconnects of one kind of request; `send` applies them."""

    retries: int = 5  # attempts after the first, each after a transient failure
    base: float = 0.5  # backoff: full jitter over base · 2^attempt, at most `cap` seconds
    cap: float = 30.0
    reconnects: int = MAX_RECONNECTS

    async def send(self, call: Callable[[], Awaitable[T]], rng: random.Random,
                   final: Callable[[BaseException], bool] | None = None) -> Sent[T]:
        """`call()` until it answers: a close before any response is sent again at once (a reconnect,
        no attempt spent), a transient failure again after a backoff while attempts are left, unless
        `final` says this failure ends it (a probe's refused connection). A ServerContractError is
        raised as it is: the run must stop, not retry."""
        attempts = reconnects = 0
        while True:
            attempts += 1
            try:
                return Sent(await call(), None, attempts, reconnects)
            except ServerContractError:
                raise
            except Exception as exc:  # noqa: BLE001 - classified; the final failure is returned, never swallowed
                closed = closed_before_response(exc)
                if closed and reconnects < self.reconnects:
                    reconnects += 1
                    attempts -= 1  # at once, on a new connection: the request was never answered
                    continue
                info = classify(exc)
                if closed:  # the SDK calls it a timeout; say what happened
                    info = FailureInfo(True, f"{CLOSED_BEFORE_RESPONSE} (after {reconnects} reconnects)")
                if info.transient and attempts <= self.retries and not (final is not None and final(exc)):
                    await asyncio.sleep(backoff_delay(attempts - 1, rng, self.base, self.cap, info.retry_after))
                    continue
                return Sent(None, info, attempts, reconnects, exc)


def backoff_delay(attempt: int, rng: random.Random, base: float = 0.5, cap: float = 30.0,
                  retry_after: float | None = None) -> float:
    """Exponential backoff with full jitter; a server's Retry-After is honoured as a floor."""
    delay = rng.uniform(0, min(cap, base * 2 ** attempt))
    return max(delay, retry_after) if retry_after is not None else delay


def retry_after_of(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a Retry-After header (seconds or an HTTP date) asks to wait; None without one."""
    if not headers:
        return None
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def causes(exc: BaseException, during: bool = False) -> Iterator[BaseException]:
    """`exc` and what it was raised from (`during`: or raised while handling), outermost first — the
    SDK and its transport chain their errors with `raise ... from` — each once."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or (cause.__context__ if during else None)


def closed_before_response(exc: BaseException) -> bool:
    """Did the server close the connection cleanly before any byte of the response? With the openai
    client on aiohttp that is a ServerDisconnectedError with no partial response (which the SDK
    reports as a timeout); on httpx, RemoteProtocolError "Server disconnected without sending a
    response". A refused connection (server down), a reset (what a crashed server's socket sends)
    or a close mid-body is a failure, not this — unless the transport saw the reset on a reused
    connection before the response (`ClosedOnReuse`)."""
    for cause in causes(exc):
        if isinstance(cause, ClosedOnReuse):
            return True
        name = type(cause).__name__
        if name == "ServerDisconnectedError":
            return getattr(cause, "message", None) in (None, "Server disconnected")
        if name == "RemoteProtocolError":
            return "without sending a response" in str(cause)
    return False


def refused(exc: BaseException) -> bool:
    """Was the connection never made (refused, no such host)? Nothing listens there: a probe says
    "unreachable" at once instead of retrying."""
    import aiohttp

    return any(isinstance(c, (aiohttp.ClientConnectorError, ConnectionRefusedError))
               or type(c).__name__ == "ConnectError" for c in causes(exc, during=True))


def timed_out(exc: BaseException) -> bool:
    """Did the request run out of time (no answer, or not all of it, within the timeout)?"""
    openai = sys.modules.get("openai")
    if openai is not None and isinstance(exc, openai.APITimeoutError):
        return _connection_cause(exc) is None
    return isinstance(exc, TimeoutError) or any(c.__name__ == "TimeoutException" for c in type(exc).__mro__)


def classify(exc: BaseException) -> FailureInfo:
    """Transient (retry): connection errors, timeouts, 408/409/429, 5xx. Anything else is final.
    The message is what gets stored: a configured API key in it (a server echoing the request's
    Authorization header in an error body) is replaced by *** before it is cut to length."""
    info = _classify(exc)
    return dataclasses.replace(info, message=redact(info.message))


def _connection_cause(exc: BaseException) -> BaseException | None:
    """The aiohttp connection error (refused, reset, closed) under an SDK "timeout", or None when
    it really timed out."""
    import aiohttp

    for cause in list(causes(exc, during=True))[1:]:
        if isinstance(cause, (aiohttp.ServerTimeoutError, TimeoutError)):
            return None
        if isinstance(cause, aiohttp.ClientConnectionError):
            return cause
    return None


def _classify(exc: BaseException) -> FailureInfo:
    if isinstance(exc, InvalidResponse):
        return FailureInfo(False, f"invalid response: {exc}")
    openai = sys.modules.get("openai")  # imported by the first Transport: no openai error exists before it
    if openai is not None:
        if isinstance(exc, openai.APITimeoutError):
            root = _connection_cause(exc)  # the SDK's aiohttp transport calls every connection error a timeout
            return FailureInfo(True, f"connection error: {type(root).__name__}: {root}" if root is not None else "timeout")
        if isinstance(exc, openai.APIConnectionError):
            if str(exc).startswith(BROKE_OFF):  # aiohttp's words for it ("ContentLengthError: 400") read as HTTP 400
                return FailureInfo(True, CLOSED_MID_BODY)
            return FailureInfo(True, f"connection error: {exc.__cause__ or exc}")
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            body = exc.response.text if exc.response is not None else ""
            transient = status in (408, 409, 429) or status >= 500
            return FailureInfo(transient, f"HTTP {status}: {_body_head(body)}",
                               retry_after_of(exc.response.headers if exc.response is not None else None))
    names = {cls.__name__ for cls in type(exc).__mro__}  # httpx's and httpx2's (the SDK's) errors alike
    if "TimeoutException" in names or isinstance(exc, TimeoutError):
        return FailureInfo(True, "timeout")
    if "TransportError" in names or isinstance(exc, ConnectionError):
        return FailureInfo(True, f"connection error: {exc}")
    if isinstance(exc, ValueError):  # a body that is not JSON
        return FailureInfo(False, f"malformed response: {exc}")
    return FailureInfo(False, f"{type(exc).__name__}: {exc}")


def _body_head(body: str) -> str:
    """The first 300 characters of an error body, with keys redacted first (a cut must not leave
    the start of a key behind)."""
    return redact(body)[:300]
