"""A load run's figures: one arm's steady-state summary, the candidate/baseline ratio, the
console table, and the results folder (`load.json`, `requests.jsonl`; docs/speed.md).

Everything here is a pure function of what `drive` recorded and what the server said about
itself, except `new_results_dir` and `write`, which only create files.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from kvqual import capacity as kvcap
from kvqual.load import stats
from kvqual.load.drive import Driven, LoadRequest
from kvqual.records import public_url

FORMAT_VERSION = 1
SATURATED_QUEUE_MEAN = 1.0  # on average at least one request waits: the server runs all it can
TOP_ERRORS = 5


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None or not np.isfinite(x) else round(float(x), digits)


def _token_times(ok: Sequence[LoadRequest]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """first, last, tokens, end of answered requests; a request that streamed no timing has its
    tokens spread over its whole life (start to end)."""
    first = np.array([r.first if r.first is not None else r.start for r in ok], dtype=float)
    last = np.array([r.last if r.last is not None else r.end for r in ok], dtype=float)
    tokens = np.array([r.completion_tokens or 0 for r in ok], dtype=float)
    end = np.array([r.end for r in ok], dtype=float)
    return first, last, tokens, end


def _errors(requests: Sequence[LoadRequest]) -> dict[str, int]:
    counts = Counter((r.error or "")[:160] for r in requests if r.failed)
    return dict(counts.most_common(TOP_ERRORS))


def _server(driven: Driven, a: float, b: float) -> dict[str, Any] | None:
    """Time-weighted gauge means and window peaks, and the generation counter's rate, over [a, b]."""
    if not driven.scrapes:
        return None
    out: dict[str, Any] = {"source": driven.source, "scrapes": len(driven.scrapes)}
    for key in ("running", "waiting", "kv_usage"):
        pairs = [(s.t, s.values[key]) for s in driven.scrapes if key in s.values]
        if not pairs:
            out[f"{key}_mean"] = out[f"{key}_peak"] = None
            continue
        ts, vs = zip(*pairs)
        out[f"{key}_mean"] = _r(stats.time_weighted_mean(ts, vs, a, b))
        inside = [v for t, v in pairs if a <= t <= b]
        out[f"{key}_peak"] = _r(max(inside)) if inside else None
    gen = [(s.t, s.values["generation_tokens"]) for s in driven.scrapes if "generation_tokens" in s.values]
    out["gen_tok_s"] = _r(stats.counter_rate(*zip(*gen), a, b), 2) if len(gen) >= 2 else None
    return out


def summarize_arm(name: str, info: dict[str, Any], model: str, expected_kv_dtype: str | None, driven: Driven,
                  concurrency: int, concurrency_source: str, warmup_s: float | None = None,
                  level: float = 0.95, identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """One target's load.json entry: what ran, the steady window and how it was chosen, steady-state
    throughput with its batch-means interval, latency percentiles, what the server reported.
    `identity`: the target's config identity (`Target.identity()`: base URLs, model, launch, KV
    dtype; no port, no secret), which `compare --speed-from` checks against its own targets."""
    requests = driven.requests
    ok = [r for r in requests if r.ok]
    duration = driven.duration_s
    generation = [r.last - r.first for r in ok if r.first is not None and r.last is not None]
    if not generation:  # no streamed timing: the whole request is the time scale
        generation = [r.end - r.start for r in ok]
    gen_p50 = float(np.median(generation)) if generation else 0.0
    rule = "--warmup" if warmup_s is not None else (
        f"max({stats.WARMUP_LIFETIMES:g} × median generation time, {stats.WARMUP_SHARE:.0%} of --duration)")
    a = min(warmup_s if warmup_s is not None else stats.warmup_seconds(duration, generation), duration)
    b = duration
    n_batches = stats.batch_count(b - a, gen_p50)
    first, last, tokens, end = _token_times(ok)
    okmask = np.ones(len(ok), dtype=bool)
    tok, req = stats.batch_rates(first, last, tokens, end, okmask, a, b, max(n_batches, 1))
    tok_ci = stats.batch_means_ci(tok if n_batches >= 2 else tok[:1], level)
    req_ci = stats.batch_means_ci(req if n_batches >= 2 else req[:1], level)
    steady = [r for r in ok if a <= r.start < b]
    itl = [(r.last - r.first) / (r.completion_tokens - 1) for r in steady
           if r.first is not None and r.last is not None and (r.completion_tokens or 0) > 1]
    failed = sum(r.failed for r in requests)
    cancelled = sum(r.cancelled for r in requests)
    server = _server(driven, a, b) if b > a else None
    lengths = [r.completion_tokens for r in steady if r.completion_tokens is not None]
    notes: list[str] = []
    if n_batches < 2:
        notes.append(f"steady window {b - a:.0f} s holds fewer than 2 generation times ({gen_p50:.1f} s): "
                     f"no interval; run longer (--duration ≥ {max(2 * a, a + 2 * gen_p50) + 1:.0f})")
    if server is None:
        notes.append("the server exports no /metrics kvqual reads: running, queued and KV usage unknown")
    elif server.get("waiting_mean") is None:
        notes.append("the server exports no queue gauge: whether its capacity was full is unknown")
    saturated = None if server is None or server.get("waiting_mean") is None else \
        server["waiting_mean"] >= SATURATED_QUEUE_MEAN
    if saturated is False:
        notes.append(f"not saturated: on average {server['waiting_mean']:g} requests queued (< "  # type: ignore[index]
                     f"{SATURATED_QUEUE_MEAN:g}); at concurrency {concurrency} its capacity was not the limit")
    return {
        "target": name, "identity": identity, "model": model, "base_urls": [public_url(u) for u in info.get("base_urls") or []],
        "engine": info.get("engine"), "kv_cache_dtype": {"expected": expected_kv_dtype,
                                                         "reported": info.get("kv_cache_dtype")},
        "kv_capacity_tokens": info.get("kv_capacity_tokens"),
        # what a token is sized by, as the judge sizes it: the configured KV dtype, else the reported one (the
        # model dtype for "auto" where the server names it: vLLM does not), and the KV memory, if reported
        "kv_size_dtype": kvcap.kv_dtype(expected_kv_dtype, info),
        "kv_memory_gib": kvcap.kv_memory_gib(info),
        "concurrency": concurrency, "concurrency_source": concurrency_source,
        "requests": {"sent": len(requests), "answered": len(ok), "failed": failed,
                     "cancelled_at_end": cancelled,
                     "failed_rate": _r(failed / (failed + len(ok)) if failed + len(ok) else 0.0),
                     "errors": _errors(requests)},
        "window": {"start_s": _r(a, 3), "end_s": _r(b, 3), "warmup_s": _r(a, 3), "rule": rule,
                   "generation_time_p50_s": _r(gen_p50, 3), "batches": n_batches,
                   "batch_s": _r((b - a) / n_batches, 3) if n_batches else None,
                   "drain_s": _r(driven.drain_s, 3), "requests_started": len(steady)},
        "output_tok_s": {**tok_ci.to_json(2), "batches": [_r(x, 2) for x in tok],
                         "lag1_autocorr": _r(stats.lag1_autocorrelation(tok) if n_batches >= 2 else None, 3)},
        "req_s": {**req_ci.to_json(4), "batches": [_r(x, 4) for x in req]},
        "ttft_s": stats.percentiles([r.first - r.start for r in steady if r.first is not None]),
        "itl_s": stats.percentiles(itl),
        "latency_s": stats.percentiles([r.end - r.start for r in steady]),
        "completion_tokens": {**stats.percentiles(lengths),
                              "max": max(lengths) if lengths else None,
                              "finish_length_share": _r(sum(r.finish_reason == "length" for r in steady)
                                                        / len(steady) if steady else None, 4)},
        "prompt_tokens_mean": _r(float(np.mean([r.prompt_tokens for r in steady if r.prompt_tokens is not None]))
                                 if any(r.prompt_tokens is not None for r in steady) else None, 1),
        "server": server, "saturated": saturated, "notes": notes,
    }


def compare_arms(baseline: dict[str, Any], candidate: dict[str, Any], level: float = 0.95) -> dict[str, Any]:
    """Steady-state output tok/s of candidate over baseline, Fieller's interval on the two arms'
    batch means, and the concurrency each sustained (the server's mean running requests)."""
    est = stats.fieller_ratio_ci(baseline["output_tok_s"]["batches"] if baseline["window"]["batches"] >= 2
                                 else [baseline["output_tok_s"]["estimate"]],
                                 candidate["output_tok_s"]["batches"] if candidate["window"]["batches"] >= 2
                                 else [candidate["output_tok_s"]["estimate"]], level)
    running = lambda arm: (arm.get("server") or {}).get("running_mean")  # noqa: E731
    notes = []
    if candidate.get("saturated") is False:
        notes.append("the candidate was not saturated: the ratio is bounded by the offered load; "
                     "a higher --concurrency may show more")
    if est.low is None:
        notes.append("no interval: an arm has fewer than 2 batches, or the baseline's throughput is not "
                     "shown to be above zero")
    return {"baseline": baseline["target"], "candidate": candidate["target"], "metric": "output_tok_s",
            "method": "Fieller (independent batch means, Welch-Satterthwaite df)",
            **est.to_json(4), "sustained_running": {"baseline": running(baseline), "candidate": running(candidate)},
            "capacity": kvcap.split(baseline.get("kv_capacity_tokens"), baseline.get("kv_size_dtype"),
                                    candidate.get("kv_capacity_tokens"), candidate.get("kv_size_dtype"),
                                    baseline.get("kv_memory_gib"), candidate.get("kv_memory_gib")),
            "notes": notes}


def document(arms: list[dict[str, Any]], params: dict[str, Any], provenance: dict[str, Any],
             status: str, level: float = 0.95) -> dict[str, Any]:
    """load.json: version, what ran with which parameters, every arm, the ratio for two arms."""
    ratio = compare_arms(arms[0], arms[1], level) if len(arms) == 2 else None
    return {"kvqual_load_version": FORMAT_VERSION, "status": status, **provenance, "params": params,
            "arms": arms, "ratio": ratio}


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def new_results_dir(results_dir: str | Path, names: Sequence[str], now: float | None = None) -> Path:
    """A fresh `results/load-<a>[-vs-<b>]-<YYYYmmdd-HHMMSS>[-N]/`: never one that exists."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    base = Path(results_dir) / f"load-{'-vs-'.join(_UNSAFE.sub('_', n) for n in names)}-{stamp}"
    Path(results_dir).mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"{base}: 999 load folders with this name already")


def write(folder: Path, doc: dict[str, Any], requests: dict[str, Sequence[LoadRequest]]) -> None:
    """load.json (written whole, then renamed: never half a file) and requests.jsonl."""
    tmp = folder / "load.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    tmp.replace(folder / "load.json")
    with (folder / "requests.jsonl").open("w", encoding="utf-8") as fh:
        for name, rows in requests.items():
            for r in rows:
                fh.write(json.dumps({"target": name, **r.to_json()}) + "\n")


def _fmt(x: Any, spec: str = ".3g", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def _ci(e: dict[str, Any], spec: str = ".4g") -> str:
    if e.get("low") is None:
        return _fmt(e.get("estimate"), spec)
    return f"{_fmt(e['estimate'], spec)} [{_fmt(e['low'], spec)}, {_fmt(e['high'], spec)}]"


def table_rows(arm: dict[str, Any]) -> list[tuple[str, str]]:
    """What the console shows of one arm, in reading order (label, value)."""
    s = arm.get("server") or {}
    w, c = arm["window"], arm["completion_tokens"]
    ms = lambda d, k: _fmt(None if d.get(k) is None else 1000 * d[k], ".3g")  # noqa: E731
    return [
        ("engine / KV dtype", f"{arm['engine'] or '?'} / {arm['kv_cache_dtype']['reported'] or '?'}"),
        ("KV capacity (tokens)", _fmt(arm["kv_capacity_tokens"], ",")),
        ("concurrency (offered)", str(arm["concurrency"])),
        ("running / queued (mean)", f"{_fmt(s.get('running_mean'))} / {_fmt(s.get('waiting_mean'))}"),
        ("KV usage mean / peak", f"{_fmt(s.get('kv_usage_mean'), '.2f')} / {_fmt(s.get('kv_usage_peak'), '.2f')}"),
        ("output tok/s [95% CI]", _ci(arm["output_tok_s"])),
        ("requests/s", _ci(arm["req_s"], ".3g")),
        ("server gen tok/s", _fmt(s.get("gen_tok_s"), ".4g")),
        ("TTFT p50 / p90 / p99 (s)", " / ".join(_fmt(arm["ttft_s"][k]) for k in ("p50", "p90", "p99"))),
        ("ITL p50 / p90 (ms)", f"{ms(arm['itl_s'], 'p50')} / {ms(arm['itl_s'], 'p90')}"),
        ("output tokens mean / at max", f"{_fmt(c['mean'], '.4g')} / "
                                        f"{_fmt(None if c['finish_length_share'] is None else 100 * c['finish_length_share'], '.0f')}%"),
        ("answered / failed", f"{arm['requests']['answered']} / {arm['requests']['failed']}"),
        ("steady window (s), batches", f"{w['start_s']:.0f}–{w['end_s']:.0f}, {w['batches']}"),
    ]


def print_table(doc: dict[str, Any], out: Callable[..., Any] | None = None) -> None:
    """The arms side by side, then the ratio and every note (rich, to stdout)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False) if out is None else Console(file=out, highlight=False, width=120)
    table = Table(title=f"kvqual load: {doc['params']['duration_s']:g} s at concurrency "
                        f"{doc['arms'][0]['concurrency']}, max_tokens {doc['params']['max_tokens']}")
    table.add_column("")
    rows = [table_rows(arm) for arm in doc["arms"]]
    for arm in doc["arms"]:
        table.add_column(arm["target"], justify="right")
    for i, (label, _) in enumerate(rows[0]):
        table.add_row(label, *(r[i][1] for r in rows))
    console.print(table)
    ratio = doc.get("ratio")
    if ratio:
        run = ratio["sustained_running"]
        console.print(f"{ratio['candidate']}/{ratio['baseline']} steady output tok/s: {_ci(ratio, '.3g')}x "
                      f"(95% CI, Fieller); sustained running {_fmt(run['baseline'])} → {_fmt(run['candidate'])}")
        line = kvcap.sentence(ratio.get("capacity") or {})
        if line:
            console.print(line)
    for arm in doc["arms"]:
        for note in arm["notes"]:
            console.print(f"note: {arm['target']}: {note}")
    for note in (ratio or {}).get("notes", []):
        console.print(f"note: ratio: {note}")
