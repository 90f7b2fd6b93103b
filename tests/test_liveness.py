"""liveness.Liveness: silence alone stops nothing; silence and a server that does not answer /health does."""

import asyncio

import pytest

from kvqual.errors import InfrastructureError
from kvqual.liveness import Liveness
from kvqual.transport import Transport


async def _hole() -> tuple[asyncio.AbstractServer, str]:
    """A server that accepts connections and never answers (a hung process)."""
    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    server = await asyncio.start_server(never, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"


def test_silence_from_a_server_that_answers_its_health_check_is_a_long_request(fake_server):
    server = fake_server()

    async def main() -> str:
        t = Transport(server.base_url, "", 10)
        try:
            live = Liveness("slow", [t], stall=0.4, dead_after=2)

            async def long_generation() -> str:
                await asyncio.sleep(2.0)  # five stall periods without an answer
                return "done"

            return await live.guard(long_generation())
        finally:
            await t.aclose()

    assert asyncio.run(main()) == "done"


def test_silence_from_a_server_that_does_not_answer_its_health_check_stops_the_work():
    async def main() -> None:
        server, url = await _hole()
        t = Transport(url, "", 10)
        cancelled = []
        try:
            live = Liveness("hung", [t], stall=0.4, dead_after=2)

            async def waiting_forever() -> None:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    cancelled.append(True)
                    raise

            with pytest.raises(InfrastructureError, match="hung: no answer for .* did not answer its health "
                                                         "check 2 times in a row"):
                await asyncio.wait_for(live.guard(waiting_forever()), 20)
            assert cancelled == [True]  # the work was stopped, not left running
        finally:
            await t.aclose()
            server.close()

    asyncio.run(main())


def test_answers_keep_the_work_going_whatever_the_health_check_says():
    async def main() -> int:
        server, url = await _hole()
        t = Transport(url, "", 10)
        try:
            live = Liveness("busy", [t], stall=0.4, dead_after=2)

            async def answering() -> int:
                for _ in range(20):
                    await asyncio.sleep(0.1)
                    live.answered()
                return 20

            return await live.guard(answering())
        finally:
            await t.aclose()
            server.close()

    assert asyncio.run(main()) == 20


def test_sglangs_health_generate_is_asked_before_its_health():
    """SGLang's /health answers 200 from the HTTP process while a hung scheduler fails
    /health_generate with 503: the latter decides. A server without it (404) is asked /health."""
    from aiohttp import web

    async def main() -> tuple[str | None, str | None, list[str]]:
        from kvqual.liveness import unhealthy

        asked: list[str] = []

        async def health(request: web.Request) -> web.Response:
            asked.append(request.path)
            return web.Response(text="ok")

        async def stuck(request: web.Request) -> web.Response:
            asked.append(request.path)
            return web.Response(status=503)

        runners, urls = [], []
        for routes in ([web.get("/health", health), web.get("/health_generate", stuck)], [web.get("/health", health)]):
            app = web.Application()
            app.add_routes(routes)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            runners.append(runner)
            urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1")
        transports = [Transport(u, "", 10) for u in urls]
        try:
            return await unhealthy(transports[0], 5), await unhealthy(transports[1], 5), asked
        finally:
            for t in transports:
                await t.aclose()
            for r in runners:
                await r.cleanup()

    sglang_hung, vllm_like, asked = asyncio.run(main())
    assert sglang_hung == "/health_generate answered HTTP 503"
    assert vllm_like is None
    assert asked == ["/health_generate", "/health"]  # the second server: 404 on the first route, then /health
