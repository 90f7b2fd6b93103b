"""What a server says about itself: served models, SGLang/reference `/get_server_info`,
vLLM's `vllm:cache_config_info` in Prometheus `/metrics`. Reads only; never changes a server
(except `flush_cache`, which SGLang offers to empty its prefix cache before a run).
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any, Awaitable, Callable

from kvqual.errors import InfrastructureError, InvalidResponse, redact_json
from kvqual.retry import RetryPolicy, refused, timed_out
from kvqual.transport import Transport


def parse_prometheus(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text exposition → {sample name: [(labels, value), ...]}, by prometheus-client's
    parser (label values unescaped, a `}` or `,` inside one kept). One sample line at a time: its
    parser rejects a whole document for one line it cannot read, and one odd line of a server's
    /metrics must not cost every other figure. Histogram samples keep their `_bucket`/`_sum`/
    `_count` names, as the text has them."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        try:
            samples = [s for family in text_string_to_metric_families(line + "\n") for s in family.samples]
        except (ValueError, TypeError, IndexError):
            continue
        for s in samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def kv_dtype_from_metrics(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> str | None:
    """vLLM exports `vllm:cache_config_info{cache_dtype="fp8",...} 1`."""
    for labels, _ in metrics.get("vllm:cache_config_info", []):
        if "cache_dtype" in labels:
            return labels["cache_dtype"]
    return None


# a 429/5xx answer or a dropped connection is asked again, like the runner's requests, with a shorter
# backoff (from 0.25 s doubling up to 8 s); a refused connection is not: nothing listens there
PROBE_POLICY = RetryPolicy(retries=5, base=0.25, cap=8.0)
_RNG = random.Random(0)


async def _optional(call: Callable[[], Awaitable[Any]]) -> Any | None:
    """An endpoint the server may not offer: its answer, or None when it does not (any final status,
    a refused connection, a body that is not what was asked). Transient failures are asked again a
    few times, so one dropped connection does not silently lose what the server reports."""
    return (await PROBE_POLICY.send(call, _RNG, final=refused)).value


async def _models(transport: Transport, url: str, timeout: float, patience: float) -> Any:
    """GET /v1/models, waiting out a busy server: a server that serves one request at a time answers
    only between completions, so a timeout is asked again with a doubled timeout until `patience`
    seconds have passed. A refused connection is final at once: nothing listens there."""
    started, wait = time.monotonic(), timeout
    while True:
        sent = await PROBE_POLICY.send(lambda: transport.get_json("/models", timeout=wait), _RNG,
                                       final=lambda exc: refused(exc) or timed_out(exc))
        if sent.failure is None:
            return sent.value
        error, message = sent.error, sent.failure.message
        if isinstance(error, InvalidResponse):
            raise InfrastructureError(f"{url}: not an OpenAI model list") from None
        if error is not None and timed_out(error):
            spent = time.monotonic() - started
            if spent + 1 >= patience:
                raise InfrastructureError(f"{url}: no answer in {spent:.0f} s (timeout; the server accepts "
                                          "connections but is busy or hung)") from None
            wait = min(wait * 2, patience - spent)
            print(f"kvqual: {url} did not answer in {spent:.0f} s (busy?); waiting up to {wait:.0f} s more",
                  file=sys.stderr, flush=True)
            continue
        if message.startswith("HTTP "):
            raise InfrastructureError(f"{url}: {message[:200]}") from None
        raise InfrastructureError(f"{url}: unreachable ({message})") from None


PROBE_TIMEOUT_S = 30.0  # the longest a probe waits, whatever the run's --timeout (a probe is a small request)


def probe_timeout(run_timeout: float) -> float:
    """A probe's deadline under a run's `--timeout`: that timeout, at most PROBE_TIMEOUT_S."""
    return min(run_timeout, PROBE_TIMEOUT_S)


async def describe(base_url: str, api_key: str, timeout: float = PROBE_TIMEOUT_S,
                   patience: float | None = None) -> dict[str, Any]:
    """Everything the server reports about itself. Unreachable → InfrastructureError; a server that
    does not answer in `timeout` is asked again, with longer waits, for up to `patience` seconds."""
    transport = Transport(base_url, api_key, timeout)
    try:
        listed = await _models(transport, f"{base_url.rstrip('/')}/models", timeout, patience or timeout)
        try:
            models = [m["id"] for m in listed.get("data", [])]
        except (KeyError, TypeError, AttributeError):
            raise InfrastructureError(f"{base_url}/models: not an OpenAI model list") from None
        info: dict[str, Any] = {"models": models}
        server_info = await _optional(lambda: transport.get_json("/get_server_info", at_root=True))
        if server_info is None:  # SGLang 2026 renamed it /server_info (the old name deprecated)
            server_info = await _optional(lambda: transport.get_json("/server_info", at_root=True))
        if server_info is not None:
            si = redact_json(server_info)
            if isinstance(si, dict):  # SGLang's lists its server args, keys among them: never stored
                si = {k: ("***" if "api_key" in k and v else v) for k, v in si.items()}
            info["server_info"] = si
        metrics = await _optional(lambda: transport.get_text("/metrics", at_root=True))
    finally:
        await transport.aclose()
    parsed: dict[str, list[tuple[dict[str, str], float]]] = {}
    if metrics is not None:
        parsed = parse_prometheus(metrics)
        info["metrics_available"] = True
        vllm_dtype = kv_dtype_from_metrics(parsed)
        if vllm_dtype is not None:
            info["vllm_cache_dtype"] = vllm_dtype
        vllm_capacity = kv_capacity_from_metrics(parsed)
        if vllm_capacity is not None:
            info["vllm_kv_capacity_tokens"] = vllm_capacity
        vllm_kv_bytes = _cache_config_label(parsed, "kv_cache_memory_bytes")
        if vllm_kv_bytes is not None:
            info["vllm_kv_cache_memory_bytes"] = int(float(vllm_kv_bytes))
    info["kv_cache_dtype"] = reported_kv_dtype(info)
    info["kv_capacity_tokens"] = reported_kv_capacity(info)
    info["engine"] = engine_of(info, parsed)
    return info


def kv_capacity_from_metrics(metrics: dict[str, list[tuple[dict[str, str], float]]]) -> int | None:
    """vLLM's KV capacity in tokens: `kv_cache_size_tokens` on `vllm:cache_config_info` where the
    engine exports it, else `num_gpu_blocks` × `block_size` from the same labels."""
    for labels, _ in metrics.get("vllm:cache_config_info", []):
        try:
            if labels.get("kv_cache_size_tokens") not in (None, "", "None"):
                return int(float(labels["kv_cache_size_tokens"]))
            if labels.get("num_gpu_blocks") not in (None, "", "None") and labels.get("block_size"):
                return int(float(labels["num_gpu_blocks"])) * int(float(labels["block_size"]))
        except ValueError:
            continue
    return None


def _cache_config_label(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> str | None:
    """A number among vLLM's `vllm:cache_config_info` labels (its CacheConfig), None when unset."""
    for labels, _ in metrics.get("vllm:cache_config_info", []):
        value = labels.get(name)
        try:
            if value not in (None, "", "None"):
                float(value)
                return value
        except ValueError:
            continue
    return None


def reported_kv_capacity(info: dict[str, Any]) -> int | None:
    """KV capacity in tokens as the server reports it: SGLang's (and kvqual serve's)
    `max_total_num_tokens` in /get_server_info, or vLLM's from /metrics."""
    si = info.get("server_info") or {}
    value = si.get("max_total_num_tokens") if isinstance(si, dict) else None
    if value is None and isinstance(si, dict):  # SGLang's per-rank states: memory_usage.token_capacity
        states = si.get("internal_states")
        first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
        value = (first.get("memory_usage") or {}).get("token_capacity")
    if value is None:
        value = info.get("vllm_kv_capacity_tokens")
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def engine_of(info: dict[str, Any], metrics: dict[str, list[tuple[dict[str, str], float]]]) -> str | None:
    """Which engine answers, from what it exports: vLLM's `vllm:` metrics, SGLang's `sglang:` metrics
    or /get_server_info, kvqual serve's `kvqual_serve:` metrics; None when it does not say."""
    names = set(metrics)
    if any(n.startswith("kvqual_serve:") for n in names):
        return "kvqual"
    if any(n.startswith("vllm:") for n in names):
        return "vllm"
    si = info.get("server_info")
    if any(n.startswith("sglang:") for n in names) or (isinstance(si, dict) and "mem_fraction_static" in si):
        return "sglang"
    return None


def speaks_token_ids(info: dict[str, Any]) -> bool:
    """Engines known to return generated tokens as ids on request and to score token-id prompts:
    vLLM (`return_tokens_as_token_ids`, echo of a token-id prompt), kvqual serve (vLLM's shapes),
    SGLang (`return_token_ids`, native /generate with `input_ids`: forcing/sglang.py)."""
    return info.get("engine") in ("vllm", "kvqual", "sglang")


def reported_kv_dtype(info: dict[str, Any]) -> str | None:
    """The KV dtype the server reports, from whichever source it offers."""
    si = info.get("server_info") or {}
    if isinstance(si, dict) and si.get("kv_cache_dtype"):
        return str(si["kv_cache_dtype"])
    return info.get("vllm_cache_dtype")


async def flush_cache(base_url: str, api_key: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """SGLang's POST /flush_cache; True when the server flushed. Not retried: a server that does not
    answer it does not offer it. `timeout`: the run's own (`probe_timeout`), as every request has."""
    transport = Transport(base_url, api_key, timeout)
    try:
        await transport.send("POST", "/flush_cache", at_root=True)
        return True
    except Exception:  # noqa: BLE001 - any failure: nothing was flushed
        return False
    finally:
        await transport.aclose()
