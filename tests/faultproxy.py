"""A fault-injecting reverse proxy for tests (aiohttp): what a flaky network and server do to kvqual.

Run as a process:
`python tests/faultproxy.py --port P --upstream http://127.0.0.1:U --seed S --reset 0.10 --http503 0.05
 --http429 0.02 --stall 0.02 --truncate 0.02 [--stall-s 30] [--restart-after N] [--paths REGEX] [--body REGEX]`

Per request, one seeded draw picks what happens (the rates are shares of requests, cumulative ≤ 1):
- reset: the connection is dropped without a response (RST, as a crashed server's socket);
- http503: `503 Service Unavailable` (a server that is overloaded or starting);
- http429: `429 Too Many Requests` with `Retry-After: 1`;
- stall: nothing is sent for `--stall-s` seconds (longer than the client's timeout), then the
  connection is dropped;
- truncate: the upstream's response is forwarded with the Content-Length of its full body, but
  the connection closes half way through the body (mid-JSON);
- otherwise the request is forwarded unchanged (any method and path: /v1/models, /metrics,
  /get_server_info, /tokenize, completions and chat) and the upstream's answer returned as is.
`--paths REGEX` limits the faults to request paths it matches, `--body REGEX` to request bodies it
matches (e.g. `"echo": ?true`: teacher forcing only); the others are always forwarded.
`--restart-after N`: after N requests (of those the faults apply to) the proxy stops listening and
drops its open connections for about a second, then listens again (a server restart), once.
`--hang-after N`: after N requests every request hangs, /health included (a hung server).

GET /__faults (answered by the proxy itself, never faulted) returns what was injected so far:
`{"requests": n, "forwarded": n, "restarts": n, "upstream_reconnects": n, "faults": {kind: n},
"by_path": {path: {kind: n}}}`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import re
import socket
import struct
from collections import Counter, defaultdict

import aiohttp
from aiohttp import web

FAULTS = ("reset", "http503", "http429", "stall", "truncate")
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "content-length", "content-encoding", "host"}


def _drop(request: web.Request) -> None:
    """Close the client's connection at once, with a TCP reset (SO_LINGER 0), sending nothing more."""
    transport = request.transport
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


class FaultProxy:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.paths = re.compile(args.paths) if args.paths else None
        self.bodies = re.compile(args.body.encode()) if args.body else None
        self.requests = self.eligible_seen = self.forwarded = self.restarts = self.upstream_reconnects = 0
        self.faults: Counter[str] = Counter()
        self.by_path: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.session: aiohttp.ClientSession | None = None
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None

    def eligible(self, path: str, body: bytes) -> bool:
        """Whether faults apply to this request (--paths, --body)."""
        return ((self.paths is None or self.paths.search(path) is not None)
                and (self.bodies is None or self.bodies.search(body) is not None))

    def draw(self, path: str, body: bytes) -> str | None:
        """The fault for this request, or None (forward it). One draw per request, always, so the
        sequence of draws depends on the seed and the number of requests only."""
        x = self.rng.random()
        if not self.eligible(path, body):
            return None
        edge = 0.0
        for kind in FAULTS:
            edge += getattr(self.args, kind)
            if x < edge:
                return kind
        return None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/__faults":
            return web.json_response({"requests": self.requests, "forwarded": self.forwarded,
                                      "restarts": self.restarts, "upstream_reconnects": self.upstream_reconnects,
                                      "faults": dict(self.faults),
                                      "by_path": {p: dict(c) for p, c in self.by_path.items()}})
        self.requests += 1
        if self.args.hang_after and self.requests > self.args.hang_after:
            await asyncio.sleep(3600)  # a hung server: the connection stays open, nothing ever comes
        body = await request.read()
        fault = self.draw(request.path, body)
        if self.eligible(request.path, body):
            self.eligible_seen += 1
            if self.eligible_seen == self.args.restart_after:
                asyncio.get_running_loop().create_task(self.restart())
        if fault is not None:
            self.faults[fault] += 1
            self.by_path[request.path][fault] += 1
        if fault == "reset":
            _drop(request)
            return web.Response()  # never sent: the connection is gone
        if fault == "http503":
            return _error(503, "proxy: service unavailable")
        if fault == "http429":
            return _error(429, "proxy: too many requests", {"Retry-After": "1"})
        if fault == "stall":
            await asyncio.sleep(self.args.stall_s)
            _drop(request)
            return web.Response()
        try:
            status, headers, payload = await self.forward(request, body)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return _error(502, f"proxy: upstream failed: {exc}")
        self.forwarded += 1
        if fault == "truncate" and len(payload) > 1:
            response = web.StreamResponse(status=status, headers=headers)
            response.content_length = len(payload)  # the full length is announced ...
            await response.prepare(request)
            await response.write(payload[: len(payload) // 2])  # ... half of it is sent
            if request.transport is not None:
                request.transport.close()  # flushes what was written, then closes
            return response
        return web.Response(status=status, headers=headers, body=payload)

    async def forward(self, request: web.Request, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """The upstream's answer. A kept-alive upstream connection the upstream closed meanwhile (its
        keep-alive timeout: uvicorn's is 5 s, shorter than this session's) is met by a close or a reset
        before any response: sent again once on a new connection, as a reverse proxy does, so that a
        proxy told to inject nothing injects nothing (counted in `upstream_reconnects`)."""
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = self.args.upstream.rstrip("/") + request.rel_url.path_qs
        session = self.session

        async def once() -> tuple[int, dict[str, str], bytes]:
            async with session.request(request.method, url, headers=headers, data=body or None) as r:
                payload = await r.read()
                return r.status, {k: v for k, v in r.headers.items() if k.lower() not in HOP_BY_HOP}, payload

        try:
            return await once()
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            self.upstream_reconnects += 1
            return await once()

    async def restart(self) -> None:
        """Stop listening, drop every open connection, and listen again after ~1 s."""
        await asyncio.sleep(0)  # let the request that triggered it be read first
        assert self.runner is not None and self.site is not None
        await self.site.stop()
        for conn in list(self.runner.server.connections if self.runner.server else ()):
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.abort()
        self.restarts += 1
        await asyncio.sleep(self.args.restart_s)
        self.site = web.TCPSite(self.runner, "127.0.0.1", self.args.port, reuse_address=True)
        await self.site.start()

    async def serve(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                             auto_decompress=False)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        self.site = web.TCPSite(self.runner, "127.0.0.1", self.args.port, reuse_address=True)
        await self.site.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.runner.cleanup()
            await self.session.close()


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, headers=headers, content_type="application/json",
                        text=json.dumps({"error": {"message": message, "type": "faultproxy", "code": status}}))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True, help="the server's root, e.g. http://127.0.0.1:8000")
    p.add_argument("--seed", type=int, default=0)
    for kind in FAULTS:
        p.add_argument(f"--{kind}", type=float, default=0.0, help=f"share of requests: {kind}")
    p.add_argument("--stall-s", type=float, default=30.0, help="how long a stalled request hangs")
    p.add_argument("--restart-after", type=int, default=0, help="restart once, after N requests (0: never)")
    p.add_argument("--restart-s", type=float, default=1.0, help="how long a restart stops listening")
    p.add_argument("--hang-after", type=int, default=0,
                   help="after N requests, every request (any path, /health too) hangs: a hung server (0: never)")
    p.add_argument("--paths", default=None, help="fault only request paths matching this regex")
    p.add_argument("--body", default=None, help="fault only request bodies matching this regex")
    args = p.parse_args(argv)
    total = sum(getattr(args, k) for k in FAULTS)
    if not all(0 <= getattr(args, k) <= 1 for k in FAULTS) or total > 1 + 1e-9:
        p.error(f"fault rates must be in [0, 1] and add up to at most 1 (they add up to {total:g})")
    return args


if __name__ == "__main__":
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # dropped connections are the point
    try:
        asyncio.run(FaultProxy(parse_args()).serve())
    except KeyboardInterrupt:
        pass
