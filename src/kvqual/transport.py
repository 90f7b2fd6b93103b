"""The one transport: every request kvqual sends to a server (generation, teacher forcing, probes,
health waits, /metrics) goes through a `Transport` — one place that makes clients, sets auth
headers and timeouts, reads bodies within their bounds (`bodies.py`), and turns failures into the
openai SDK's exceptions that `retry.classify` reads. Whether and how often a request is sent again
is `retry.RetryPolicy`'s.

A request has a deadline: `timeout` bounds all of it (connecting, waiting, reading the body), not
each read, so a server that drips a byte at a time fails after `timeout` seconds, as a timeout.
Failure messages never carry a configured API key (`errors.redact`). A base URL's `user:password@`
(a gateway's basic auth) becomes the Authorization header, and the URL kvqual records and prints is
the one without it (`records.public_url`).
"""

from __future__ import annotations

import asyncio
import base64
import errno
import json
import os
import time
from contextvars import ContextVar
from urllib.parse import unquote, urlsplit
from typing import Any, Callable, Iterable, Mapping

import httpx

from kvqual import bodies
from kvqual.client import chunk_has_content, stream_payload
from kvqual.errors import InvalidResponse, register_secret
from kvqual.records import public_url
from kvqual.retry import BROKE_OFF, ClosedOnReuse

# whether the request under way in this task went out on a kept-alive connection (set by the direct
# session's trace hooks, which aiohttp awaits in the requesting task): a reset on one is a reconnect
_REUSED: ContextVar[bool] = ContextVar("kvqual_reused", default=False)


async def _on_reused(*_: Any) -> None:
    _REUSED.set(True)


def _reset_on_send(exc: BaseException) -> bool:
    """A connection reset (or aiohttp's "Cannot write to closing transport") while sending the
    request or waiting for the response's first byte."""
    import aiohttp

    return isinstance(exc, (ConnectionResetError, BrokenPipeError)) or (
        isinstance(exc, aiohttp.ClientOSError) and exc.errno in (errno.ECONNRESET, errno.EPIPE))


def server_root(base_url: str) -> str:
    """`http://h:p/v1` → `http://h:p` (server-native endpoints live at the root)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root



def _basic_auth(base_url: str) -> dict[str, str]:
    """The Authorization header a `user:password@` base URL asks for (empty without one); the
    credentials are registered as secrets, so no failure message carries them."""
    parts = urlsplit(base_url.replace("{port}", "1"))
    if parts.username is None and parts.password is None:
        return {}
    pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    token = base64.b64encode(pair.encode()).decode()
    for secret in (parts.password, unquote(parts.password or ""), token):
        register_secret(secret)
    return {"Authorization": f"Basic {token}"}


# ---------------------------------------------------------------- the transport

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


def _proxied() -> bool:
    """A proxy is set in the environment (the SDK's client honours it; the direct path does not)."""
    return any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARIABLES)


class Transport:
    """One AsyncOpenAI client per base URL (aiohttp backend); retries are the caller's policy.

    Requests to a plain-http server (every answer of a non-streamed run, every teacher-forcing echo,
    every probe) skip the SDK's request building (its options models, header merging, URL parsing
    and response wrapping were ~0.75 ms of client CPU a request, a third of kvqual's;
    docs/performance.md) and go out on an aiohttp session of their own configured as the SDK's is
    (same headers, auth included; same body bytes; the same timeouts, connection limit, keep-alive
    and redirects). What comes back is what the SDK would give: the same openai exceptions, chained
    to the same aiohttp errors (`_sdk_error`), so `classify` and the retry rules see no difference.
    Streamed requests, https targets and any target behind a proxy set in the environment go
    through the SDK. `at_root`: the path is under the server's root (/tokenize, /metrics), not /v1."""

    def __init__(self, base_url: str, api_key: str, timeout: float) -> None:
        self._auth = _basic_auth(base_url)  # {"Authorization": "Basic …"} for a user:password@ URL
        self.base_url = (public_url(base_url) or base_url).rstrip("/")
        register_secret(api_key)  # whatever this client sends is scrubbed from failure messages
        # A plain-http server is never spoken TLS to (requests go under base_url; no redirect is
        # followed), so its client skips loading the CA bundle: ~90 ms of CPU every Transport.
        plain_http = self.base_url.lower().startswith("http://")
        import openai  # here, not at the top: commands that never send a request (report, --help) skip its ~1 s

        self._timeout = timeout
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=0,
            default_headers=self._auth or None,
            http_client=openai.DefaultAioHttpClient(timeout=timeout, verify=not plain_http),
        )
        self._direct = plain_http and "?" not in self.base_url and "#" not in self.base_url and not _proxied()
        self._session: Any = None  # the direct path's aiohttp session, made in the loop that first sends
        self._closed = False  # after aclose no session is made again (one would outlive the loop unclosed)
        self._headers: dict[str, str] | None = None

    async def post_json(self, path: str, body: Mapping[str, Any], *, at_root: bool = False,
                        timeout: float | None = None) -> Any:
        """POST `body`; the parsed JSON, or an openai error, or `InvalidResponse` (over
        `MAX_RESPONSE_BYTES`, not JSON, non-finite, another model's)."""
        def parse(raw: bytes) -> Any:
            data = bodies.decode_json(raw, self.base_url)
            bodies.check_model(body.get("model"), data, self.base_url)
            return data

        return await self._send("POST", path, body, at_root, timeout, parse)

    async def get_json(self, path: str, *, at_root: bool = False, timeout: float | None = None) -> Any:
        """GET `path`; the parsed JSON (a list of models, a server's own description)."""
        return await self._send("GET", path, None, at_root, timeout, lambda raw: bodies.decode_json(raw, self.base_url))

    async def get_text(self, path: str, *, at_root: bool = False, timeout: float | None = None) -> str:
        """GET `path`; its body as text (Prometheus /metrics)."""
        return await self._send("GET", path, None, at_root, timeout, lambda raw: raw.decode("utf-8", "replace"))

    async def send(self, method: str, path: str, *, at_root: bool = False, timeout: float | None = None) -> bytes:
        """A request without a body whose answer is not JSON (SGLang's POST /flush_cache); its body."""
        return await self._send(method, path, None, at_root, timeout, lambda raw: raw)

    async def _send(self, method: str, path: str, body: Mapping[str, Any] | None, at_root: bool,
                    timeout: float | None, parse: Callable[[bytes], Any]) -> Any:
        """One request within its deadline (all of it, the body read included; past it, the SDK's
        timeout error, which `classify` calls "timeout"), its body held in the budget until parsed."""
        url = f"{server_root(self.base_url) if at_root else self.base_url}/{path.lstrip('/')}"
        if self._closed:  # a request still on its way when its owner closed this transport: no new session
            import aiohttp

            closed = aiohttp.ClientConnectionError("the transport was closed")
            raise _sdk_error(closed, method, url) from closed
        lease = bodies.BUDGET.lease()
        deadline = asyncio.timeout(timeout if timeout is not None else self._timeout)
        try:
            async with deadline:
                if self._direct:
                    raw = await self._fetch_direct(method, url, body, lease, timeout)
                else:
                    raw = await self._fetch_sdk(method, url if at_root else path, body, lease, timeout)
            return parse(raw)
        except TimeoutError as exc:
            if not deadline.expired():
                raise
            raise _timed_out(method, url) from exc
        finally:
            lease.release()

    def _sdk_headers(self) -> dict[str, str]:
        """The headers the SDK sends (its defaults, auth, retry count 0, read timeout) plus httpx's
        Accept-Encoding and Connection; computed once, inside the event loop (one of them names it)."""
        if self._headers is None:
            headers = {k: v for k, v in {**self._client.default_headers, **self._client.auth_headers,
                                         **self._auth}.items() if isinstance(v, str)}
            headers["x-stainless-retry-count"] = "0"
            headers["x-stainless-read-timeout"] = str(self._timeout)
            headers["Accept-Encoding"] = "gzip, deflate"
            headers["Connection"] = "keep-alive"
            self._headers = headers
        return self._headers

    async def _fetch_direct(self, method: str, url: str, body: Mapping[str, Any] | None, lease: bodies.Lease,
                            timeout: float | None) -> bytes:
        import aiohttp

        # the SDK's encoding of a body (openai._utils._json.openapi_dumps): NaN is refused before sending
        data = None if body is None else json.dumps(body, ensure_ascii=False, separators=(",", ":"),
                                                    allow_nan=False).encode()
        if self._session is None:
            # the SDK's client: 1000 connections, 5 s keep-alive, no TLS on a plain-http target; a trace
            # hook notes a reused connection (a reset on one is the server's keep-alive timeout: a reconnect)
            trace = aiohttp.TraceConfig()
            trace.on_connection_reuseconn.append(_on_reused)
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=1000, keepalive_timeout=5.0, ssl=False), trace_configs=[trace])
        t = timeout if timeout is not None else self._timeout
        _REUSED.set(False)
        try:
            response = await self._session.request(
                method, url, data=data, headers=self._sdk_headers(), max_redirects=20,
                timeout=aiohttp.ClientTimeout(sock_connect=t, sock_read=t, connect=t)).__aenter__()
        except Exception as exc:  # noqa: BLE001 - mapped to what the SDK raises for it
            mapped = _sdk_error(exc, method, url)
            if _REUSED.get() and _reset_on_send(exc):  # before any byte of the response, on a kept-alive one
                closed = ClosedOnReuse(f"reset on a reused connection: {exc}")
                closed.__cause__ = exc
                raise mapped from closed
            if mapped is exc:
                raise
            raise mapped from exc
        try:
            raw = await bodies.read_body(response.content.iter_any(), response.headers.get("content-length"), lease,
                                   self.base_url, lambda exc: _sdk_error(exc, method, url, reading=True))
            if not 200 <= response.status < 300:  # httpx's raise_for_status, under the SDK: 3xx not followed too
                raise _status_error(response, raw, method, url)
            return raw
        finally:
            response.release()

    async def _fetch_sdk(self, method: str, path: str, body: Mapping[str, Any] | None, lease: bodies.Lease,
                         timeout: float | None) -> bytes:
        options: Any = {"timeout": timeout} if timeout is not None else {}
        if method == "GET":
            response = await self._client.get(path, cast_to=httpx.Response, stream=True, options=options)
        else:
            response = await self._client.post(path, body=body, cast_to=httpx.Response, stream=True, options=options)
        try:
            return await bodies.read_body(response.aiter_bytes(), response.headers.get("content-length"), lease,
                                    self.base_url, lambda exc: _sdk_read_error(exc, response.request))
        finally:
            await response.aclose()

    async def post_stream(self, path: str, body: Mapping[str, Any], chat: bool) -> tuple[list[dict[str, Any]], float | None, float | None]:
        """POST a streamed request; (chunks, seconds to the first token, seconds to the last token)."""
        t0 = time.perf_counter()
        first = last = None
        chunks: list[dict[str, Any]] = []
        import openai  # loaded already: this Transport made its client with it

        lease = bodies.BUDGET.lease()
        deadline = asyncio.timeout(self._timeout)
        try:
            async with deadline:
                stream = await self._client.post(path, body=stream_payload(body), cast_to=object, stream=True,
                                                 stream_cls=openai.AsyncStream[object])
                try:
                    async for chunk in stream:
                        if not isinstance(chunk, dict):
                            raise ValueError(f"stream chunk is not a JSON object: {str(chunk)[:100]}")
                        if stream.response.num_bytes_downloaded > bodies.MAX_RESPONSE_BYTES:
                            raise InvalidResponse(bodies.too_big(self.base_url))
                        if not lease.grow(stream.response.num_bytes_downloaded):
                            await lease.reach(stream.response.num_bytes_downloaded)
                        if not chunks:
                            bodies.check_model(body.get("model"), chunk, self.base_url)
                        if chunk_has_content(chunk, chat):
                            last = time.perf_counter() - t0
                            first = last if first is None else first
                        chunks.append(chunk)
                finally:
                    await stream.close()
        except TimeoutError as exc:
            if not deadline.expired():
                raise
            raise _timed_out("POST", f"{self.base_url}/{path.lstrip('/')}") from exc
        finally:
            lease.release()
        return chunks, first, last  # the SDK decodes SSE events, NaN included: the parsers check logprobs

    async def aclose(self) -> None:
        """Close both sessions, whole even when a cancellation arrives meanwhile (the cancellation is
        raised after): a session cut short in its close is reported unclosed at exit, on stderr below
        kvqual's last line."""
        self._closed = True
        session, self._session = self._session, None
        closing = asyncio.ensure_future(self._close(session))
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            await asyncio.wait({closing})
            raise

    async def _close(self, session: Any) -> None:
        try:
            if session is not None:
                await session.close()
        finally:
            await self._client.close()


async def close_all(transports: Iterable[Transport]) -> None:
    """Close every one of `transports`, all of them even when a cancellation arrives in between;
    that cancellation is raised once they are closed."""
    interrupted: BaseException | None = None
    for transport in transports:
        try:
            await transport.aclose()
        except BaseException as exc:  # noqa: BLE001 - raised once every one is closed
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


def _timed_out(method: str, url: str) -> BaseException:
    """What the SDK raises for a request out of time: `classify` calls it "timeout"."""
    import httpx2
    import openai

    return openai.APITimeoutError(request=httpx2.Request(method, url))


def _sdk_read_error(exc: Exception, request: Any) -> BaseException:
    """A body the SDK's transport stopped reading: a timeout, or a connection error, as the SDK
    reports it when it reads one itself."""
    import openai  # loaded already: only a Transport's responses come here

    if any(cls.__name__ == "TimeoutException" for cls in type(exc).__mro__):
        return openai.APITimeoutError(request=request)
    return openai.APIConnectionError(message=f"{BROKE_OFF}: {exc}", request=request)


def _sdk_error(exc: BaseException, method: str, url: str, reading: bool = False) -> BaseException:
    """What the SDK raises (with `from exc`) for an aiohttp error of its aiohttp transport: that
    transport maps every aiohttp connection error (timeouts, refusals, resets, disconnects) to an
    httpx timeout, which the SDK raises as APITimeoutError, and a broken payload or a bad URL to a
    request error, raised as APIConnectionError; anything else it lets through as it is. Reading
    the body (`reading`), every error that is not a timeout is APIConnectionError, as
    `_sdk_read_error` says it. `classify` then finds the same aiohttp error under the same openai one."""
    import aiohttp
    import httpx2
    import openai

    request = httpx2.Request(method, url)
    if isinstance(exc, aiohttp.ClientConnectionError):
        return openai.APITimeoutError(request=request)
    if reading:
        return openai.APIConnectionError(message=f"{BROKE_OFF}: {exc}", request=request)
    # httpx's own errors for a too long redirect chain or a URL it cannot send to are request errors too
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.TooManyRedirects, aiohttp.NonHttpUrlClientError,
                        aiohttp.InvalidUrlClientError)):
        return openai.APIConnectionError(request=request)
    return exc


def _status_error(response: Any, body: bytes, method: str, url: str) -> BaseException:
    """The SDK's APIStatusError for a response that is not 2xx: its status, headers and body (read
    already; decoded, so its Content-Encoding is dropped) are what `classify` reads."""
    import httpx2
    import openai

    headers = [(k, v) for k, v in response.raw_headers if k.lower() != b"content-encoding"]
    resp = httpx2.Response(response.status, headers=headers, content=body, request=httpx2.Request(method, url))
    return openai.APIStatusError(f"Error code: {response.status}", response=resp, body=None)
