"""Start the reference server: blocking (the CLI) or in-process on a free port (tests).

The model is loaded once per process (`load_model` is cached); each server gets its own
engine thread and KV cache settings, so a bf16 and an fp8 server can share the weights.

Shutdown is prompt: SIGINT / SIGTERM stop the engine at once, so requests in flight fail
("server shutting down") instead of holding uvicorn's graceful shutdown open until the
launcher's SIGKILL; uvicorn cancels whatever is left after SHUTDOWN_GRACE_S.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import FrameType
from typing import Iterator

import torch
import uvicorn

from kvqual.serve.app import ServeConfig, ServerState, create_app
from kvqual.serve.engine import Engine, SamplingParams
from kvqual.serve.dtypes import check_hicache
from kvqual.serve.kvcache import (
    KvScale,
    check_kv_fault,
    kv_bytes_per_token,
    kv_capacity_tokens,
    resolve_kv_cache_dtype,
)
from kvqual.serve.model import load_model, resolve_source
from kvqual.serve.prefixcache import PrefixCache, PrefixCacheStats, host_capacity_tokens

DEFAULT_KV_BUDGET_MB = 256
SHUTDOWN_GRACE_S = 2.0  # after a stop signal, connections still open are cancelled after this long


def build_state(
    model: str | None = None,
    kv_cache_dtype: str = "auto",
    kv_scale: KvScale = "dynamic",
    max_batch: int = 32,
    context_length: int | None = None,
    kv_budget_mb: int = DEFAULT_KV_BUDGET_MB,
    kv_fault: str = "none",
    enable_prefix_caching: bool = False,
    enable_hierarchical_cache: bool = False,
    hicache_ratio: float = 2.0,
    hicache_size: float = 0.0,
) -> ServerState:
    """Load the model (cached) and start an engine for these settings (`kv_fault`: an injected
    failure, see kvcache.py and prefixcache.py; ValueError where it lacks what it needs). The
    hierarchical cache implies prefix caching; its host tier holds `hicache_size` GB, or when that
    is 0 `hicache_ratio` x the KV capacity."""
    dtype = resolve_kv_cache_dtype(kv_cache_dtype)
    prefix_caching = enable_prefix_caching or enable_hierarchical_cache
    fault = check_kv_fault(dtype, kv_fault, prefix_caching)
    check_hicache(hicache_ratio, hicache_size)
    torch.set_flush_denormal(True)  # subnormals make float32 CPU matmuls ~8x slower (measured)
    loaded = load_model(resolve_source(model))
    limit = min(context_length or loaded.max_position_embeddings, loaded.max_position_embeddings)
    budget = kv_budget_mb * 1024 * 1024
    per_token = kv_bytes_per_token(loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, dtype)
    capacity = kv_capacity_tokens(budget, per_token)
    config = ServeConfig(dtype, kv_scale, max_batch, limit, capacity, budget, fault, prefix_caching,
                         enable_hierarchical_cache, hicache_size, hicache_ratio)
    store = None
    if prefix_caching:
        host = (host_capacity_tokens(capacity, per_token, hicache_size, hicache_ratio)
                if enable_hierarchical_cache else None)
        store = PrefixCache(host, stale_blocks=fault == "stale-cache-block")
    engine = Engine(loaded, dtype, kv_scale, max_batch, limit, capacity, kv_fault=fault, prefix_cache=store)
    engine.start()
    warm_up(engine)
    if store is not None:  # the warm-up prompt is no one's prefix: start empty, counters at 0
        flushed = threading.Event()
        engine.flush_cache(lambda _: flushed.set(), only_if_idle=False)
        flushed.wait(timeout=30)
        store.stats = PrefixCacheStats()
    return ServerState(loaded, engine, config)


def warm_up(engine: Engine, rounds: int = 2, tokens: int = 16) -> None:
    """Run a few short greedy generations: the first CPU passes are several times slower."""
    for _ in range(rounds):
        done = threading.Event()
        engine.submit(list(range(100, 132)), SamplingParams(max_tokens=tokens, temperature=0.0), lambda _: done.set())
        done.wait(timeout=300)


class _Server(uvicorn.Server):
    """uvicorn's server that also stops the engine on a stop signal: its clients are going away
    (kvqual stopping its launched server), so requests in flight end now with an error."""

    def __init__(self, config: uvicorn.Config, engine: Engine) -> None:
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # Engine.shutdown joins the engine thread: not in a signal handler
        threading.Thread(target=self.engine.shutdown, name="kvqual-serve-stop", daemon=True).start()


def serve_forever(state: ServerState, host: str, port: int, log_level: str = "info") -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM), then stop the engine."""
    config = uvicorn.Config(create_app(state), host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
    try:
        with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it handled (as uvicorn.run)
            _Server(config, state.engine).run()
    finally:
        state.engine.shutdown()


@contextlib.contextmanager
def running_server(
    kv_cache_dtype: str = "auto",
    port: int = 0,
    host: str = "127.0.0.1",
    model: str | None = None,
    kv_scale: KvScale = "dynamic",
    max_batch: int = 32,
    context_length: int | None = None,
    kv_fault: str = "none",
    kv_budget_mb: int = DEFAULT_KV_BUDGET_MB,
    enable_prefix_caching: bool = False,
    enable_hierarchical_cache: bool = False,
    hicache_ratio: float = 2.0,
    hicache_size: float = 0.0,
) -> Iterator[str]:
    """Serve in this process on a background thread; yields the base URL (`http://host:port`, no /v1)."""
    state = build_state(model, kv_cache_dtype, kv_scale, max_batch, context_length, kv_budget_mb, kv_fault,
                        enable_prefix_caching, enable_hierarchical_cache, hicache_ratio, hicache_size)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(state), log_level="warning", lifespan="off",
                                           timeout_graceful_shutdown=SHUTDOWN_GRACE_S))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            state.engine.shutdown()
            raise RuntimeError("in-process kvqual server failed to start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        state.engine.shutdown()
