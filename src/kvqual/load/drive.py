"""The closed loop: `concurrency` workers each send a request, wait for its answer, send the next,
until `duration_s` has passed; the requests still in flight then finish (the drain), so every
token generated before the end is counted: those generating at the end finish within one
generation time, and what is still in flight 1.5 longest generation times after the end was
queued at the end (no token before it) and is cancelled, not waited for (a queue of 120 behind
30 running would take five generation times to drain). Beside it, the server's `/metrics` are read every
`SCRAPE_INTERVAL_S` and kept with their times (telemetry.py's vocabulary), so gauges can be
averaged over the steady window afterwards.

Requests go through the runner's `request_one` (one transport, the same parsing as a run),
streamed for TTFT and inter-token latency, with no retries: under load a failed request is a
failure of the server at that load, counted as such, and the worker moves on (after a backoff,
so a server that is down is not hammered).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Iterator

from kvqual.config import Target
from kvqual.errors import InfrastructureError
from kvqual.probe import parse_prometheus
from kvqual.records import GenerationParams, Item
from kvqual.plan import item_order
from kvqual.retry import backoff_delay
from kvqual.runner import request_one
from kvqual.telemetry import metrics_text, snapshot, source_of
from kvqual.transport import Transport, close_all

SCRAPE_INTERVAL_S = 1.0
PROGRESS_EVERY_S = 15.0
DRAIN_LIFETIMES = 1.5
CANCELLED = "cancelled: still queued when the load ended"

__all__ = ["LoadRequest", "Scrape", "Driven", "drive", "cycle_items", "SCRAPE_INTERVAL_S"]


@dataclass(frozen=True)
class LoadRequest:
    """One request of a load run; times in seconds since the load started. `first`/`last` are
    the first and last token's arrival (None when it failed or streamed no token)."""

    id: str
    suite: str
    start: float
    end: float
    first: float | None
    last: float | None
    completion_tokens: int | None
    prompt_tokens: int | None
    finish_reason: str | None
    error: str | None
    cancelled: bool = False  # still queued when the load ended: cut off, neither answer nor failure

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def failed(self) -> bool:
        return self.error is not None and not self.cancelled

    def to_json(self) -> dict[str, Any]:
        r = lambda x: None if x is None else round(x, 4)  # noqa: E731
        return {"id": self.id, "suite": self.suite, "start_s": r(self.start), "first_token_s": r(self.first),
                "last_token_s": r(self.last), "end_s": r(self.end), "completion_tokens": self.completion_tokens,
                "prompt_tokens": self.prompt_tokens, "finish_reason": self.finish_reason, "error": self.error,
                "cancelled": self.cancelled}


@dataclass(frozen=True)
class Scrape:
    """One reading of every replica's /metrics, merged: counters and running/waiting summed, KV
    usage the fullest replica's (as telemetry.Scraper merges them)."""

    t: float
    values: dict[str, float]


@dataclass(frozen=True)
class Driven:
    requests: tuple[LoadRequest, ...]
    scrapes: tuple[Scrape, ...]
    duration_s: float  # when the last request was sent (the load's end)
    drain_s: float  # how long the requests in flight then took to finish
    source: str | None  # which engine's metric names the server exported


def cycle_items(items: tuple[Item, ...], seed: int) -> Iterator[tuple[Item, int]]:
    """The prompts in the seeded item order, over and over; the repeat index (which shifts the
    seed, so sampled outputs differ) counts the passes."""
    keyed = {(i.suite, i.id): i for i in items}
    order = [keyed[k] for k in item_order(keyed, seed)]
    passes = 0
    while True:
        for item in order:
            yield item, passes
        passes += 1


async def _scrape_once(scrapers: list[Transport]) -> tuple[dict[str, float], str | None]:
    merged: dict[str, float] = {}
    source = None
    for transport in scrapers:
        text = await metrics_text(transport)
        if text is None:
            continue
        parsed = parse_prometheus(text)
        source = source or source_of(parsed)
        for key, value in snapshot(parsed).items():
            if key == "kv_usage":
                merged[key] = max(merged.get(key, 0.0), value)
            else:
                merged[key] = merged.get(key, 0.0) + value
    return merged, source


async def drive(target: Target, items: tuple[Item, ...], params: GenerationParams, model: str, *,
                concurrency: int, duration_s: float, timeout_s: float,
                progress: bool = True) -> Driven:
    """Keep `concurrency` requests in flight for `duration_s`, then drain. Every item is sent with
    `params.max_tokens` (an item's own max_tokens is not used: the load's output length is one
    setting). InfrastructureError when max(8, concurrency) requests in a row cannot reach the
    server."""
    prompts = cycle_items(tuple(replace(i, max_tokens=None) for i in items), params.seed)
    transports = [Transport(u, target.api_key(), timeout_s) for u in target.base_urls]
    scrapers = [Transport(u, target.api_key(), 5.0) for u in target.base_urls]  # /metrics, sent once each
    requests: list[LoadRequest] = []
    scrapes: list[Scrape] = []
    source: list[str | None] = [None]
    rng = random.Random(params.seed)
    abort: list[BaseException] = []
    streak = [0]
    ending = [False]  # set before the drain's cut-off cancels what is left
    t0 = time.perf_counter()
    now = lambda: time.perf_counter() - t0  # noqa: E731

    async def worker(slot: int) -> None:
        transport = transports[slot % len(transports)]
        failures = 0
        while not abort and now() < duration_s:
            item, repeat = next(prompts)
            sent = now()
            try:
                sample, _ = await request_one(transport, item, repeat, params, model, 0, rng)
            except asyncio.CancelledError:
                if ending[0]:
                    requests.append(LoadRequest(item.id, item.suite, sent, now(), None, None, None, None, None,
                                                CANCELLED, cancelled=True))
                raise
            end = now()
            start = end - (sample.latency_s or 0.0)
            first = start + sample.ttft_s if sample.ok and sample.ttft_s is not None else None
            last = None if first is None else first + (sample.itl_s or 0.0) * max((sample.completion_tokens or 0) - 1, 0)
            requests.append(LoadRequest(item.id, item.suite, start, end, first, last, sample.completion_tokens,
                                        sample.prompt_tokens, sample.finish_reason, sample.error))
            if sample.ok:
                failures, streak[0] = 0, 0
                continue
            failures += 1
            if sample.error and sample.error.startswith(("connection error", "timeout")):
                streak[0] += 1
                if streak[0] >= max(8, concurrency):
                    abort.append(InfrastructureError(
                        f"{target.name}: {streak[0]} requests in a row failed ({sample.error}); "
                        f"is the server at {transport.base_url} up?"))
                    return
            await asyncio.sleep(backoff_delay(failures - 1, rng, base=0.25, cap=5.0))

    async def poll() -> None:
        while True:
            values, src = await _scrape_once(scrapers)
            source[0] = source[0] or src
            if values:
                scrapes.append(Scrape(now(), values))
            await asyncio.sleep(SCRAPE_INTERVAL_S)

    async def report() -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            ok = [r for r in requests if r.ok]
            tokens = sum(r.completion_tokens or 0 for r in ok)
            t = now()
            phase = f"{t:.0f}/{duration_s:.0f} s" if t < duration_s else f"draining ({t - duration_s:.0f} s)"
            print(f"kvqual: load {target.name}: {phase}, {len(ok)} answered, {sum(r.failed for r in requests)} failed, "
                  f"{tokens / max(t, 1e-9):.0f} tok/s so far", file=sys.stderr, flush=True)

    poller = asyncio.create_task(poll())
    reporter = asyncio.create_task(report()) if progress else None
    workers = [asyncio.create_task(worker(i)) for i in range(concurrency)]
    try:
        await asyncio.wait(workers, timeout=duration_s)
        pending = {w for w in workers if not w.done()}
        if pending and not abort:
            grace = drain_grace(requests, timeout_s)
            _, pending = await asyncio.wait(pending, timeout=max(0.0, duration_s + grace - now()))
        ending[0] = True
        for w in pending:
            w.cancel()
        outcomes = await asyncio.gather(*workers, return_exceptions=True)
        raised = [o for o in outcomes if isinstance(o, Exception)]  # a server that breaks the contract
        if raised:
            raise raised[0]
        drained = now()
        values, _ = await _scrape_once(scrapers)  # a last reading after the drain
        if values:
            scrapes.append(Scrape(drained, values))
    finally:
        for task in (*workers, poller, reporter):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (*workers, poller, reporter) if t is not None), return_exceptions=True)
        await close_all((*scrapers, *transports))
    if abort:
        raise abort[0]
    return Driven(tuple(sorted(requests, key=lambda r: r.start)), tuple(scrapes), duration_s,
                  max(0.0, drained - duration_s), source[0])


def drain_grace(requests: list[LoadRequest], timeout_s: float) -> float:
    """How long requests in flight at the end may take to finish: DRAIN_LIFETIMES × the longest
    generation (first to last token) seen, so every request that was generating at the end
    finishes and its tokens before the end are counted; what is still waiting after that was
    queued at the end (no token before it) and is cancelled. Before any answer: `timeout_s`."""
    spans = [r.last - r.first for r in requests if r.ok and r.first is not None and r.last is not None]
    spans = spans or [r.end - r.start for r in requests if r.ok]
    return min(timeout_s, DRAIN_LIFETIMES * max(spans) + 1.0) if spans else timeout_s
