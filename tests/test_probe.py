"""probe.describe against servers that are slow to answer: a server that serves one request at a
time answers /v1/models only between completions; it is busy, not unreachable."""

import asyncio

import pytest
from aiohttp import web

from kvtest import free_port

from kvqual.errors import InfrastructureError
from kvqual.probe import describe


async def _serve(routes: dict[str, object]) -> tuple[web.AppRunner, str]:
    """An aiohttp app with these GET routes on a free loopback port: (runner, its /v1 base URL)."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}/v1"


async def _busy_server(first_delay: float, every: bool = False):
    """/v1/models answers after `first_delay` s the first time (a completion in the way), then at
    once; `every`: every time (a hung server)."""
    calls = {"n": 0}

    async def models(_: web.Request) -> web.Response:
        calls["n"] += 1
        if calls["n"] == 1 or every:
            await asyncio.sleep(first_delay)
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    runner, url = await _serve({"/v1/models": models})
    return runner, url, calls


def test_a_busy_server_is_waited_for_not_called_unreachable(capsys):
    async def go():
        runner, url, calls = await _busy_server(1.5)
        try:
            info = await describe(url, "", timeout=0.3, patience=20)
            return info, calls["n"]
        finally:
            await runner.cleanup()

    info, n = asyncio.run(go())
    assert info["models"] == ["m"] and n >= 2
    assert "busy?" in capsys.readouterr().err


def test_a_server_that_never_answers_is_an_infrastructure_fault_that_says_busy_or_hung():
    async def go():
        runner, url, _ = await _busy_server(4, every=True)
        try:
            await describe(url, "", timeout=0.3, patience=1.5)
        finally:
            await runner.cleanup()

    with pytest.raises(InfrastructureError, match="busy or hung"):
        asyncio.run(go())


def test_nothing_listening_is_unreachable_at_once():
    with pytest.raises(InfrastructureError, match="unreachable"):
        asyncio.run(describe(f"http://127.0.0.1:{free_port()}/v1", "", timeout=0.3, patience=60))


def test_a_key_in_server_info_is_never_kept():
    """SGLang's /get_server_info lists its server args, `api_key` among them; what the probe keeps
    (and the manifest stores) has every other field and never the key."""
    async def go():
        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

        async def info(_: web.Request) -> web.Response:
            return web.json_response({"api_key": "sk-sglang-server-secret-0042", "admin_api_key": None,
                                      "kv_cache_dtype": "fp8_e4m3", "mem_fraction_static": 0.85,
                                      "max_total_num_tokens": 4096})

        runner, url = await _serve({"/v1/models": models, "/get_server_info": info})
        try:
            return await describe(url, "", timeout=5)
        finally:
            await runner.cleanup()

    got = asyncio.run(go())
    assert "sk-sglang-server-secret-0042" not in repr(got)
    assert got["server_info"]["api_key"] == "***" and got["server_info"]["admin_api_key"] is None
    assert (got["engine"], got["kv_cache_dtype"], got["kv_capacity_tokens"]) == ("sglang", "fp8_e4m3", 4096)
