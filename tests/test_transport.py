"""The transport's bounds: a request's deadline covers all of it, bodies held at once stay within the
budget, and a body cut short says so (tests/kvtest.py's loopback server; aiohttp apps)."""

import asyncio
import contextlib
import random
import time

import pytest
from aiohttp import web

from kvtest import LoopbackServer
from kvqual import bodies
from kvqual.retry import CLOSED_MID_BODY, RetryPolicy, classify
from kvqual.bodies import BodyBudget
from kvqual.transport import Transport, close_all

ANSWER = {"choices": [{"index": 0, "text": " ok " + "x" * 80, "finish_reason": "stop", "logprobs": None}]}


@contextlib.asynccontextmanager
async def _serving(path: str, handler):
    """An aiohttp app answering POSTs to `path` with `handler`, on a free loopback port: its port."""
    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port it bound
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "sdk"])
def test_a_dripping_server_fails_at_the_deadline_not_after_the_last_byte(direct):
    """One byte every 0.1 s keeps every read within a 1 s timeout; the body (~170 bytes) would take
    17 s. The request fails after ~1 s as a timeout, and the policy retries it as one."""
    server = LoopbackServer(answer=lambda body: ANSWER, drip=0.1)

    async def go() -> tuple[float, object, int]:
        transport = Transport(server.base_url, "", timeout=1.0)
        transport._direct = direct  # noqa: SLF001 - both paths: the direct POST and the SDK's
        try:
            t0 = time.monotonic()
            sent = await asyncio.wait_for(RetryPolicy(retries=1, base=0.01).send(
                lambda: transport.post_json("/completions", {"model": "m", "prompt": "p"}), random.Random(0)), 30)
            return time.monotonic() - t0, sent, server.posts
        finally:
            await transport.aclose()

    took, sent, posts = asyncio.run(go())
    assert sent.failure is not None and sent.failure.message == "timeout" and sent.failure.transient
    assert (sent.attempts, posts) == (2, 2)  # the deadline's timeout is retried like any other
    assert took < 4.0, f"two attempts took {took:.1f} s: the timeout bounded each read, not the request"


def test_a_body_cut_after_its_headers_says_the_connection_closed_mid_body():
    """Not aiohttp's "ContentLengthError: 400", which reads as an HTTP 400; transient, on both paths."""
    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "100000", "Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"model": "m", "choices": [')
        request.transport.close()
        return response

    async def go(direct: bool) -> str:
        async with _serving("/v1/completions", cut) as port:
            transport = Transport(f"http://127.0.0.1:{port}/v1", "", timeout=5)
            transport._direct = direct  # noqa: SLF001
            try:
                await transport.post_json("/completions", {"model": "m"})
            except Exception as exc:  # noqa: BLE001 - what the runner records
                info = classify(exc)
                assert info.transient
                return info.message
            finally:
                await transport.aclose()
        raise AssertionError("a cut body was taken for an answer")

    for direct in (True, False):
        message = asyncio.run(go(direct))
        assert message == CLOSED_MID_BODY and "400" not in message


def test_the_oldest_holder_always_reads_on_so_growing_leases_never_all_wait():
    """Eight requests that each grow to a whole body at once, under a budget of two bodies: every one
    finishes, and never more than the budget is held."""
    budget = BodyBudget(total=4096, cap=2048)

    async def one(i: int) -> None:
        lease = budget.lease()
        try:
            for size in (512, 1024, 2048):
                await lease.reach(size)
                await asyncio.sleep(0.001 * (i % 3))
        finally:
            lease.release()

    async def all_of_them() -> None:
        await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(8))), 10)

    asyncio.run(all_of_them())
    assert budget.held == 0 and 2048 < budget.peak <= 4096


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_concurrent_large_bodies_stay_within_the_body_budget(monkeypatch, declared):
    """16 answers of 1.5 MiB in flight at once would hold 24 MiB; under a budget of 8 MiB they all
    arrive, and what was held at once stayed within it (and, with no budget to speak of, does not)."""
    cap, body = 2 << 20, 3 << 19
    monkeypatch.setattr(bodies, "MAX_RESPONSE_BYTES", cap)
    payload = b'{"choices": [{"text": "' + b"x" * (body - 40) + b'"}]}'

    async def big(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if declared:
            response.content_length = len(payload)
        await response.prepare(request)
        for i in range(0, len(payload), 1 << 18):  # in parts, with a pause: the requests overlap
            await response.write(payload[i:i + (1 << 18)])
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    async def go(budget: BodyBudget) -> list[int]:
        monkeypatch.setattr(bodies, "BUDGET", budget)
        async with _serving("/v1/completions", big) as port:
            transport = Transport(f"http://127.0.0.1:{port}/v1", "", timeout=30)
            try:
                answers = await asyncio.gather(*(transport.post_json("/completions", {"model": "m"})
                                                 for _ in range(16)))
            finally:
                await transport.aclose()
        return [len(a["choices"][0]["text"]) for a in answers]

    bounded = BodyBudget(total=8 << 20, cap=cap)
    assert asyncio.run(go(bounded)) == [body - 40] * 16
    assert bounded.held == 0 and 3 * body <= bounded.peak <= 8 << 20
    unbounded = BodyBudget(total=1 << 30, cap=cap)
    asyncio.run(go(unbounded))
    assert unbounded.peak > 8 << 20  # what the budget prevented


def test_a_user_password_base_url_is_basic_auth_and_never_recorded() -> None:
    """A gateway's `http://user:password@host/v1`: the credentials go out as basic auth (aiohttp
    refuses an Authorization header beside URL credentials), and the URL kvqual keeps is without them."""
    import base64

    from kvqual.errors import redact
    from kvqual.transport import Transport, _basic_auth

    assert _basic_auth("http://127.0.0.1:8000/v1") == {}
    header = _basic_auth("http://kvq:p%40ss-word-123@127.0.0.1:8000/v1")["Authorization"]
    assert base64.b64decode(header.removeprefix("Basic ")) == b"kvq:p@ss-word-123"
    assert "p@ss-word-123" not in redact("refused: p@ss-word-123") and header[6:] not in redact(header)
    t = Transport("http://kvq:p%40ss-word-123@127.0.0.1:8000/v1", "", 5.0)
    assert t.base_url == "http://127.0.0.1:8000/v1"


def test_closing_is_whole_even_when_cancelled_and_no_session_is_made_after():
    """A cancellation arriving while a transport closes still leaves both sessions closed (else
    aiohttp prints "Unclosed client session" at exit, below kvqual's last line: seen in CI), and a
    request still on its way after the close fails as a connection error instead of opening one."""
    server = LoopbackServer(answer=lambda body: ANSWER)

    async def go() -> tuple[object, object, object, str]:
        transports = [Transport(server.base_url, "", timeout=5.0) for _ in range(3)]
        for t in transports:
            await t.post_json("/completions", {"model": "m", "prompt": "p"})  # each has its session now
        sessions = [t._session for t in transports]  # noqa: SLF001
        closing = asyncio.ensure_future(close_all(transports))
        await asyncio.sleep(0)  # inside the first close
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        try:
            await transports[0].post_json("/completions", {"model": "m", "prompt": "p"})
        except Exception as exc:  # noqa: BLE001 - what the runner would record
            after = classify(exc).message
        else:
            after = "answered"
        return sessions, [t._session for t in transports], [t._client.is_closed() for t in transports], after

    sessions, now, sdk_closed, after = asyncio.run(go())
    assert all(s.closed for s in sessions), "a cancelled close left a session open"
    assert now == [None, None, None] and all(sdk_closed)
    assert after == "connection error: ClientConnectionError: the transport was closed", after
