"""Server-side figures from Prometheus `/metrics` while a run is sent: what the server itself
counted (tokens generated, KV cache usage, its own TTFT and inter-token histograms).

SGLang (`sglang:`, with `--enable-metrics`), vLLM (`vllm:`), llama.cpp's server (`llamacpp:`,
with `--metrics`) and the reference server (`kvqual_serve:`) name the same things differently; `FAMILIES` maps them to one vocabulary.
Counters are read as deltas between the first and the last scrape of the run; gauges are
sampled every `interval_s` and summarised (peak, mean). Figures include any other traffic the
server had meanwhile: a shared server makes them an upper bound, which the docs say.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from kvqual.probe import parse_prometheus
from kvqual.transport import Transport, close_all

Parsed = Mapping[str, list[tuple[dict[str, str], float]]]

# our name → the metric names servers export, most specific first. Histograms name the base.
FAMILIES: dict[str, tuple[str, ...]] = {
    "prompt_tokens": ("vllm:prompt_tokens_total", "sglang:prompt_tokens_total", "kvqual_serve:prompt_tokens_total",
                      "llamacpp:prompt_tokens_total"),
    "generation_tokens": ("vllm:generation_tokens_total", "sglang:generation_tokens_total",
                          "kvqual_serve:generation_tokens_total", "llamacpp:tokens_predicted_total"),
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage",
                 "kvqual_serve:token_usage"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "kvqual_serve:num_running_reqs",
                "llamacpp:requests_processing"),
    # requests the server accepted but does not run yet: queued behind its own parallelism
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "kvqual_serve:num_queued_reqs",
                "llamacpp:requests_deferred"),
    # prefix cache, in prompt tokens: looked up, served from cache, served after a load back from the host tier
    "prefix_queries": ("vllm:prefix_cache_queries_total", "kvqual_serve:prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "kvqual_serve:prefix_cache_hits_total"),
    "host_hits": ("kvqual_serve:hicache_host_hits_total",),
    "cache_hit_rate": ("sglang:cache_hit_rate", "kvqual_serve:cache_hit_rate"),  # a gauge (SGLang's only figure)
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
            "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
}
COUNTERS = ("prompt_tokens", "generation_tokens", "prefix_queries", "prefix_hits", "host_hits")
GAUGES = ("kv_usage", "running", "waiting", "cache_hit_rate")
HISTOGRAMS = ("ttft", "itl")


def _sum(parsed: Parsed, name: str) -> float | None:
    rows = parsed.get(name)
    return sum(v for _, v in rows) if rows else None


def snapshot(parsed: Parsed) -> dict[str, float]:
    """One scrape in our vocabulary: counters and gauges summed over label sets; histograms as
    `<name>_sum` / `<name>_count`. Families the server does not export are absent."""
    out: dict[str, float] = {}
    for ours in COUNTERS + GAUGES:
        for name in FAMILIES[ours]:
            value = _sum(parsed, name)
            if value is not None:
                out[ours] = value
                break
    for ours in HISTOGRAMS:
        for name in FAMILIES[ours]:
            total, count = _sum(parsed, f"{name}_sum"), _sum(parsed, f"{name}_count")
            if total is not None and count is not None:
                out[f"{ours}_sum"], out[f"{ours}_count"] = total, count
                break
    return out


def source_of(parsed: Parsed) -> str | None:
    """Which server family exported the figures: 'vllm', 'sglang', 'kvqual_serve', 'llamacpp' or None."""
    for prefix in ("vllm", "sglang", "kvqual_serve", "llamacpp"):
        if any(name.startswith(f"{prefix}:") for name in parsed):
            return prefix
    return None


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def summarize(first: Mapping[str, float], last: Mapping[str, float], gauges: Mapping[str, list[float]],
              wall_s: float, source: str | None, scrapes: int) -> dict[str, Any]:
    """Counter deltas over the run, gauge peak/mean, histogram means. Pure; None where unknown."""
    def delta(key: str) -> float | None:
        if key not in first or key not in last:
            return None
        d = last[key] - first[key]
        return d if d >= 0 else None  # a counter that went down: the server restarted mid-run

    gen = delta("generation_tokens")
    out: dict[str, Any] = {
        "source": source, "scrapes": scrapes, "wall_s": _round(wall_s, 3),
        "prompt_tokens": delta("prompt_tokens"), "generation_tokens": gen,
        "gen_tok_s": _round(gen / wall_s, 2) if gen is not None and wall_s > 0 else None,
    }
    queries, hits = delta("prefix_queries"), delta("prefix_hits")  # null unless the server has a prefix cache
    out.update(prefix_cache_queries=queries, prefix_cache_hits=hits, host_hits=delta("host_hits"),
               prefix_hit_rate=_round(hits / queries) if queries and hits is not None else None)
    for ours in GAUGES:
        values = gauges.get(ours) or []
        out[f"{ours}_peak"] = _round(max(values)) if values else None
        out[f"{ours}_mean"] = _round(sum(values) / len(values)) if values else None
    for ours in HISTOGRAMS:
        total, count = delta(f"{ours}_sum"), delta(f"{ours}_count")
        out[f"{ours}_mean_s"] = _round(total / count, 5) if total is not None and count else None
    return out


@dataclass
class Scraper:
    """Polls `/metrics` of each base URL during a run; `summary()` merges replicas. A scrape that
    fails is not retried: the next one comes `interval_s` later."""

    base_urls: tuple[str, ...]
    api_key: str = ""
    interval_s: float = 2.0
    timeout_s: float = 5.0
    _first: dict[str, dict[str, float]] = field(default_factory=dict)
    _last: dict[str, dict[str, float]] = field(default_factory=dict)
    _gauges: dict[str, list[float]] = field(default_factory=dict)
    _source: str | None = None
    _scrapes: int = 0
    _t0: float | None = None
    _t1: float | None = None
    _task: asyncio.Task | None = None
    _transports: dict[str, Transport] | None = None

    async def _scrape(self) -> None:
        assert self._transports is not None
        now = time.perf_counter()
        totals: dict[str, float] = {}
        answered = False
        for url, transport in self._transports.items():
            text = await metrics_text(transport)
            if text is None:
                continue
            parsed = parse_prometheus(text)
            self._source = self._source or source_of(parsed)
            snap = snapshot(parsed)
            if not snap:
                continue  # /metrics without any family we know
            answered = True
            self._first.setdefault(url, snap)
            self._last[url] = snap
            for key in GAUGES:  # usage: the fullest replica; running and waiting requests: all replicas
                if key in snap:
                    combine = max if key == "kv_usage" else (lambda a, b: a + b)
                    totals[key] = combine(totals.get(key, 0.0), snap[key])
        if answered:  # a server exporting counters but no gauges still counts
            self._scrapes += 1
            self._t0 = now if self._t0 is None else self._t0
            self._t1 = now
            for key, value in totals.items():
                self._gauges.setdefault(key, []).append(value)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self._scrape()

    async def start(self) -> None:
        self._transports = {url: Transport(url, self.api_key, self.timeout_s) for url in self.base_urls}
        await self._scrape()
        if self._scrapes:
            self._task = asyncio.create_task(self._loop())

    async def stop(self) -> dict[str, Any] | None:
        """A last scrape and the summary; None when no replica exports Prometheus metrics."""
        if self._transports is None:
            return None
        try:
            if self._task is not None:
                self._task.cancel()
                try:
                    await self._task
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():  # this task's own cancellation arrived meanwhile
                        raise
            if self._scrapes:
                await self._scrape()
        finally:
            await close_all(self._transports.values())
        if not self._scrapes or self._t0 is None or self._t1 is None:
            return None
        first = _merge(self._first.values())
        last = _merge(self._last[u] for u in self._first)
        return summarize(first, last, self._gauges, self._t1 - self._t0, self._source, self._scrapes)


async def metrics_text(transport: Transport) -> str | None:
    """A server's Prometheus `/metrics`, sent once; None when it does not answer it."""
    try:
        return await transport.get_text("/metrics", at_root=True)
    except Exception:  # noqa: BLE001 - not offered, or not now: the figures are optional
        return None


def _merge(snaps: Any) -> dict[str, float]:
    """Replicas' counters add up."""
    out: dict[str, float] = {}
    for snap in snaps:
        for key, value in snap.items():
            out[key] = out.get(key, 0.0) + value
    return out
