"""Client-side speed of one arm (throughput, latency, TTFT/ITL) and whether its own server's metrics
say it measured a queue; per-request throughput paired for the ratio."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from kvqual.judge.arms import Key, rounded
from kvqual.records import Sample


def _pct(values: list[float], q: float) -> float | None:
    return rounded(float(np.percentile(values, q)), 4) if values else None



def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of request intervals: the time an arm had requests in flight (a
    sequential compare's rounds leave gaps between them, which are not the arm's time)."""
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total



def speed(samples: Mapping[Key, Sample], concurrency: int,
          server: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """Client-side throughput and latency of one arm (TTFT/ITL when streamed), plus what the
    server's own /metrics counted during the run (`server`, from the manifest) when it has any."""
    ok = [s for s in samples.values() if s.ok and s.latency_s and s.started_at]
    if not ok:
        return None
    wall = max(busy_seconds([(s.started_at, s.started_at + s.latency_s) for s in ok]), 1e-9)
    lat = [s.latency_s for s in ok]
    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    itl = [s.itl_s for s in ok if s.itl_s is not None]
    return {"output_tok_s": rounded(sum(s.completion_tokens or 0 for s in ok) / wall, 2), "req_s": rounded(len(ok) / wall, 3),
            "latency_p50": _pct(lat, 50), "latency_p95": _pct(lat, 95), "concurrency": concurrency,
            "ttft_p50": _pct(ttft, 50), "ttft_p95": _pct(ttft, 95), "itl_p50": _pct(itl, 50), "itl_p95": _pct(itl, 95),
            "server": dict(server) if server else None, "queued": queueing(server, concurrency)}



QUEUE_MEAN_MIN = 1.0  # requests waiting at the server, on average over the run, that make speed a queue figure



def queueing(server: Mapping[str, Any] | None, concurrency: int) -> str | None:
    """Why this arm's speed figures measure the server's queue rather than its speed, or None: its
    own /metrics say requests waited on average (vLLM num_requests_waiting, SGLang num_queue_reqs,
    llama.cpp requests_deferred, kvqual serve num_queued_reqs) while kvqual kept `concurrency` in
    flight. Without those metrics the queue is not seen (docs/speed.md)."""
    if not server or server.get("waiting_mean") is None:
        return None
    waiting, running = server["waiting_mean"], server.get("running_peak")
    if waiting < QUEUE_MEAN_MIN:
        return None
    ran = f"ran at most {running:g} at once and " if running is not None else ""
    return (f"the server {ran}queued {waiting:.3g} requests on average of the {concurrency} kvqual kept in flight: "
            "latency and tok/s measure the queue")



def throughput_pairs(base: Mapping[Key, Sample], cand: Mapping[Key, Sample]) -> tuple[np.ndarray, np.ndarray]:
    """Per-request output tokens/s, paired by key (requests that produced tokens in both arms)."""
    keys = [k for k in base if k in cand and base[k].ok and cand[k].ok and (base[k].latency_s or 0) > 0
            and (cand[k].latency_s or 0) > 0 and (base[k].completion_tokens or 0) > 0]
    b = np.array([(base[k].completion_tokens or 0) / base[k].latency_s for k in keys])  # type: ignore[operator]
    c = np.array([(cand[k].completion_tokens or 0) / cand[k].latency_s for k in keys])  # type: ignore[operator]
    return b, c
