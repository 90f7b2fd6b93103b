"""The HTTP layer: FastAPI routes over one Engine (OpenAI, vLLM /tokenize and /reset_prefix_cache,
SGLang-style /get_server_info and /flush_cache).

HTTP runs in asyncio; generation runs on the engine's worker thread, whose callbacks
resolve asyncio futures (or, for `"stream": true`, feed a queue: see stream.py). Bad
requests get OpenAI-style error bodies and never stop the server.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from kvqual.serve.engine import Engine, Generation, SamplingParams
from kvqual.serve.kvcache import KvCacheDtype, KvFault, KvScale
from kvqual.serve.model import LoadedModel
from kvqual.serve.prefixcache import BLOCK_SIZE, PrefixCacheStats
from kvqual.serve.protocol import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    StreamChunker,
    chat_response,
    check_model,
    completion_response,
    parse_chat,
    parse_completion,
    parse_messages,
)
from kvqual.serve.stream import sse_stream

VERSION = "0.1.0"
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. "  # SGLang's /flush_cache texts
           "(When there are running or waiting requests, the operation will not be performed.)\n")
NOT_FLUSHED = "Cache not flushed because there are pending requests."


@dataclass(frozen=True)
class ServeConfig:
    """What the server was started with (and reports in /get_server_info)."""

    kv_cache_dtype: KvCacheDtype
    kv_scale: KvScale
    max_batch: int
    context_length: int
    kv_capacity_tokens: int
    kv_budget_bytes: int
    kv_fault: KvFault = "none"  # an injected field failure (--kv-fault); reported only here
    enable_prefix_caching: bool = False  # on with either flag: --enable-hierarchical-cache implies it
    enable_hierarchical_cache: bool = False
    hicache_size: float = 0.0  # GB, as given (0: the ratio sets the host tier)
    hicache_ratio: float = 2.0


class ServerState:
    """Everything the routes need: the loaded model, its engine, token strings, counters."""

    def __init__(self, loaded: LoadedModel, engine: Engine, config: ServeConfig):
        self.loaded, self.engine, self.config = loaded, engine, config
        tok = loaded.tokenizer
        self.pieces = [tok.decode([i]) for i in range(len(tok))]
        self.model_name = loaded.source.served_name
        self.http_requests_total = 0
        self.http_errors_total = 0

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a completions prompt (the tokenizer's own special-token rule)."""
        return list(self.loaded.tokenizer(text).input_ids)

    def render_chat(self, messages: tuple[dict[str, str], ...]) -> str:
        """The prompt text the chat template makes (with the assistant turn opened)."""
        return self.loaded.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)

    def encode_rendered(self, rendered: str) -> list[int]:
        """Token ids of a rendered chat prompt (special tokens are already in the text)."""
        return list(self.loaded.tokenizer(rendered, add_special_tokens=False).input_ids)

    def decode_output(self, ids: Sequence[int]) -> str:
        """Generated text of these token ids, decoded as the engine decodes it."""
        return self.loaded.tokenizer.decode(ids, skip_special_tokens=True)

    def check_length(self, ids: list[int], max_tokens: int) -> None:
        """Refuse prompts that do not fit the context (OpenAI's context_length_exceeded)."""
        limit = self.config.context_length
        if not ids:
            raise ApiError("the prompt is empty", param="prompt")
        if len(ids) + max_tokens > limit:
            raise ApiError(
                f"This model's maximum context length is {limit} tokens; the prompt has {len(ids)} tokens "
                f"and max_tokens is {max_tokens}.",
                param="prompt",
                code="context_length_exceeded",
            )
        vocab = len(self.pieces)
        if any(not 0 <= t < vocab for t in ids):
            raise ApiError(f"token ids must be in [0, {vocab})", param="prompt")

    async def generate(self, ids: list[int], params: SamplingParams) -> Generation:
        """Run one prompt through the engine and await its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def deliver(result: Generation | BaseException) -> None:
            def settle() -> None:
                if future.done():
                    return
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

            loop.call_soon_threadsafe(settle)

        self.engine.submit(ids, params, deliver)
        return await future

    async def flush_cache(self, only_if_idle: bool) -> bool:
        """Empty the prefix cache on the engine thread; False when `only_if_idle` and requests are in flight."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        self.engine.flush_cache(lambda ok: loop.call_soon_threadsafe(future.set_result, ok), only_if_idle)
        return await future

    def stream(self, req: CompletionRequest | ChatRequest, ids: list[int], params: SamplingParams) -> StreamingResponse:
        """Stream one prompt's tokens as Server-Sent Events while they are generated."""
        chunker = StreamChunker(req, self.model_name, self.pieces, self.decode_output)
        return StreamingResponse(sse_stream(self.engine, ids, params, chunker), media_type="text/event-stream")


async def _json_body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"malformed JSON body: {exc}") from None


def _get_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(f"'{name}' must be of type bool", param=name)
    return value


def create_app(state: ServerState) -> FastAPI:
    """The FastAPI app serving one model."""
    app = FastAPI(title="kvqual serve", version=VERSION)
    app.state.kvqual = state

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        state.http_errors_total += 1
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.middleware("http")
    async def count(request: Request, call_next):
        state.http_requests_total += 1
        return await call_next(request)

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "kvqual",
                    "root": state.loaded.source.path,
                    "max_model_len": state.config.context_length,
                }
            ],
        }

    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        cfg = state.config
        return {
            "model_path": state.loaded.source.path,
            "served_model_name": state.model_name,
            "kv_cache_dtype": cfg.kv_cache_dtype,
            "kv_scale": cfg.kv_scale,
            "kv_fault": cfg.kv_fault,
            "context_length": cfg.context_length,
            "max_total_num_tokens": cfg.kv_capacity_tokens,
            "kv_cache_budget_bytes": cfg.kv_budget_bytes,
            "max_batch": cfg.max_batch,
            "max_running_requests": cfg.max_batch,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "disable_radix_cache": not cfg.enable_prefix_caching,
            "enable_hierarchical_cache": cfg.enable_hierarchical_cache,
            "hicache_size": cfg.hicache_size,
            "hicache_ratio": cfg.hicache_ratio,
            "prefix_cache_block_size": BLOCK_SIZE,
            "version": VERSION,
        }

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> PlainTextResponse:
        # SGLang's route and texts: refused while requests are running or queued
        if await state.flush_cache(only_if_idle=True):
            return PlainTextResponse(FLUSHED)
        s = state.engine.stats
        return PlainTextResponse(f"{NOT_FLUSHED} #queue-req: {s.num_queued_reqs}, #running-req: {s.num_running_reqs}\n",
                                 status_code=400)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        # vLLM's dev endpoint: an empty 200; running requests keep their own K/V, so it never waits
        await state.flush_cache(only_if_idle=False)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(prometheus_text(state), media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        # vLLM's shapes (TokenizeCompletionRequest / TokenizeChatRequest → TokenizeResponse)
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise ApiError("request body must be a JSON object")
        check_model(body, state.model_name)
        if "messages" in body:
            messages = parse_messages(body["messages"])
            opened = _get_bool(body, "add_generation_prompt", True)
            rendered = state.loaded.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                                                  add_generation_prompt=opened)
            ids = (state.encode_text(rendered) if _get_bool(body, "add_special_tokens", False)
                   else state.encode_rendered(rendered))
        elif isinstance(body.get("prompt"), str):
            ids = (state.encode_text(body["prompt"]) if _get_bool(body, "add_special_tokens", True)
                   else state.encode_rendered(body["prompt"]))
        else:
            raise ApiError("give 'prompt' (a string) or 'messages'", param="prompt")
        return {
            "count": len(ids),
            "max_model_len": state.config.context_length,
            "tokens": ids,
            "token_strs": [state.pieces[i] for i in ids] if _get_bool(body, "return_token_strs", False) else None,
        }

    @app.post("/v1/completions", response_model=dict[str, Any])
    async def completions(request: Request) -> dict[str, Any] | StreamingResponse:
        req = parse_completion(await _json_body(request), state.model_name)
        encoded, texts = [], []
        for prompt in req.prompts:
            ids = state.encode_text(prompt) if isinstance(prompt, str) else list(prompt)
            state.check_length(ids, req.params.max_tokens)
            encoded.append(ids)
            texts.append(prompt if isinstance(prompt, str) else state.loaded.tokenizer.decode(ids))
        if req.stream:
            return state.stream(req, encoded[0], req.params)
        results = await asyncio.gather(*(state.generate(ids, req.params) for ids in encoded))
        return completion_response(req, texts, results, state.model_name, state.pieces)

    @app.post("/v1/chat/completions", response_model=dict[str, Any])
    async def chat(request: Request) -> dict[str, Any] | StreamingResponse:
        body = await _json_body(request)
        default = state.config.context_length
        req = parse_chat(body, state.model_name, default)
        ids = state.encode_rendered(state.render_chat(req.messages))
        params = req.params
        if not isinstance(body.get("max_tokens"), int) and not isinstance(body.get("max_completion_tokens"), int):
            params = SamplingParams(**{**params.__dict__, "max_tokens": max(1, default - len(ids))})
        state.check_length(ids, params.max_tokens)
        if req.stream:
            return state.stream(req, ids, params)
        result = await state.generate(ids, params)
        return chat_response(req, result, state.model_name, state.pieces)

    return app


def prometheus_text(state: ServerState) -> str:
    """Prometheus exposition of the engine's counters, prefixed `kvqual_serve:`."""
    s, cfg = state.engine.stats, state.config
    store = state.engine.prefix_cache
    p = store.stats if store is not None else PrefixCacheStats()
    labels = f'model_name="{state.model_name}",kv_cache_dtype="{cfg.kv_cache_dtype}",kv_scale="{cfg.kv_scale}"'
    rows = [
        ("requests_total", "counter", "Generation requests admitted", s.requests_total),
        ("prompt_tokens_total", "counter", "Prompt tokens prefilled", s.prompt_tokens_total),
        ("generation_tokens_total", "counter", "Tokens generated", s.generation_tokens_total),
        ("http_requests_total", "counter", "HTTP requests received", state.http_requests_total),
        ("http_errors_total", "counter", "HTTP requests refused", state.http_errors_total),
        ("num_running_reqs", "gauge", "Requests in the running batch", s.num_running_reqs),
        ("num_queued_reqs", "gauge", "Requests waiting for admission", s.num_queued_reqs),
        ("kv_cache_bytes_in_use", "gauge", "Bytes of stored K/V (padding included)", s.kv_cache_bytes_in_use),
        ("max_total_num_tokens", "gauge", "KV capacity in tokens", cfg.kv_capacity_tokens),
        ("token_usage", "gauge", "Share of the KV capacity held by running requests (SGLang's token_usage)",
         round(s.kv_tokens_in_use / cfg.kv_capacity_tokens, 6) if cfg.kv_capacity_tokens else 0.0),
        ("gen_throughput", "gauge", "Generated tokens/s over the last 10 s", round(s.gen_throughput(), 3)),
        ("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache", p.queries_tokens),
        ("prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache", p.hit_tokens),
        ("hicache_host_hits_total", "counter", "Prompt tokens served after a load back from the host tier",
         p.host_hit_tokens),
        ("prefix_cache_evictions_total", "counter", "Prefix cache entries evicted from the device store",
         p.evictions),
        ("prefix_cache_tokens", "gauge", "Tokens held by the prefix cache's device store", p.device_tokens),
        ("hicache_host_tokens", "gauge", "Tokens held by the host tier", p.host_tokens),
        ("cache_hit_rate", "gauge", "Prefix cache hits / queries (tokens) since start (SGLang's cache_hit_rate)",
         round(p.hit_rate, 6)),
    ]
    lines = []
    for name, kind, help_text, value in rows:
        lines += [f"# HELP kvqual_serve:{name} {help_text}", f"# TYPE kvqual_serve:{name} {kind}"]
        lines.append(f"kvqual_serve:{name}{{{labels}}} {value}")
    lines.append(f'kvqual_serve:cache_config_info{{{labels}}} 1')
    return "\n".join(lines) + "\n"

