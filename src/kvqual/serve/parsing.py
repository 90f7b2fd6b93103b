"""OpenAI-compatible request validation (pure functions, no I/O): a request body checked and turned into
a frozen value (vLLM's `cache_salt` included), or `ApiError`, which the HTTP layer returns as an
OpenAI-style error body. serve/protocol.py, which shapes the responses, re-exports these names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvqual.serve.engine import SamplingParams

MAX_LOGPROBS = 20


class ApiError(Exception):
    """A request the server refuses: HTTP status plus OpenAI's error fields."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status

    def body(self) -> dict[str, Any]:
        """OpenAI's error body."""
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class CompletionRequest:
    """A validated /v1/completions request: one or more prompts (text or token ids)."""

    prompts: tuple[str | tuple[int, ...], ...]
    params: SamplingParams
    as_token_ids: bool
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage


@dataclass(frozen=True)
class ChatRequest:
    """A validated /v1/chat/completions request."""

    messages: tuple[dict[str, str], ...]
    params: SamplingParams
    top_logprobs: int | None
    as_token_ids: bool
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage


def _get(body: dict[str, Any], name: str, kinds: tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in kinds:
        raise ApiError(f"'{name}' must be of type {'/'.join(k.__name__ for k in kinds)}", param=name)
    if not isinstance(value, kinds):
        raise ApiError(f"'{name}' must be of type {'/'.join(k.__name__ for k in kinds)}", param=name)
    return value


def check_model(body: dict[str, Any], served_model: str) -> None:
    """An unknown model is a 404, as OpenAI and vLLM answer it; a missing one means the served model."""
    model = body.get("model")
    if model is not None and model != served_model:
        raise ApiError(f"The model `{model}` does not exist.", param="model", code="model_not_found", status=404)


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise ApiError("'stop' must be a string or a list of strings", param="stop")


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage): `stream` a bool; `stream_options` an object, allowed only when streaming."""
    stream = _get(body, "stream", (bool,), False)
    options = _get(body, "stream_options", (dict,))
    if options is None:
        return stream, False
    if not stream:
        raise ApiError("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise ApiError("'stream_options.include_usage' must be of type bool", param="stream_options")
    return stream, bool(include_usage)


def _cache_salt(body: dict[str, Any]) -> str | None:
    """vLLM's `cache_salt`: absent or null for the shared namespace, else a non-empty string."""
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise ApiError("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    return salt


def _common_params(body: dict[str, Any], max_tokens: int, logprobs: int | None, echo: bool) -> SamplingParams:
    temperature = float(_get(body, "temperature", (int, float), 1.0))
    top_p = float(_get(body, "top_p", (int, float), 1.0))
    if temperature < 0 or temperature > 2:
        raise ApiError("'temperature' must be between 0 and 2", param="temperature")
    if not 0 < top_p <= 1:
        raise ApiError("'top_p' must be in (0, 1]", param="top_p")
    if _get(body, "n", (int,), 1) != 1:
        raise ApiError("only n=1 is supported", param="n")
    if max_tokens < 0:
        raise ApiError("'max_tokens' must be >= 0", param="max_tokens")
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise ApiError(f"'logprobs' must be between 0 and {MAX_LOGPROBS}", param="logprobs")
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=_get(body, "seed", (int,)),
        stop=_stop(body),
        logprobs=logprobs,
        echo=echo,
        cache_salt=_cache_salt(body),
    )


def _prompts(value: Any) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return (tuple(value),)
    if isinstance(value, list) and value:
        out: list[str | tuple[int, ...]] = []
        for p in value:
            if isinstance(p, str):
                out.append(p)
            elif isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
                out.append(tuple(p))
            else:
                raise ApiError("'prompt' items must be strings or non-empty lists of token ids", param="prompt")
        return tuple(out)
    raise ApiError("'prompt' must be a string, a list of token ids, or a list of either", param="prompt")


def parse_completion(body: Any, served_model: str) -> CompletionRequest:
    """Validate a /v1/completions body."""
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    check_model(body, served_model)
    if "prompt" not in body:
        raise ApiError("'prompt' is required", param="prompt")
    echo = bool(_get(body, "echo", (bool,), False))
    max_tokens = _get(body, "max_tokens", (int,), 16)
    if max_tokens == 0 and not echo:
        raise ApiError("'max_tokens' must be >= 1 unless 'echo' is true", param="max_tokens")
    params = _common_params(body, max_tokens, _get(body, "logprobs", (int,)), echo)
    prompts = _prompts(body["prompt"])
    stream, include_usage = _stream_flags(body)
    if stream and echo:
        raise ApiError("'echo' is not supported with 'stream'", param="echo")
    if stream and len(prompts) > 1:
        raise ApiError("'stream' takes a single prompt", param="prompt")
    as_ids = bool(_get(body, "return_tokens_as_token_ids", (bool,), False))
    return CompletionRequest(prompts, params, as_ids, stream, include_usage)


def parse_messages(value: Any) -> tuple[dict[str, str], ...]:
    """Messages as role/content strings; content given as text parts is joined."""
    if not isinstance(value, list) or not value:
        raise ApiError("'messages' must be a non-empty list", param="messages")
    out = []
    for m in value:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError("each message needs a string 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise ApiError("each message needs 'content' as a string or text parts", param="messages")
        out.append({"role": m["role"], "content": content})
    return tuple(out)


def parse_chat(body: Any, served_model: str, default_max_tokens: int) -> ChatRequest:
    """Validate a /v1/chat/completions body (max_tokens defaults to the remaining context)."""
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    check_model(body, served_model)
    messages = parse_messages(body.get("messages"))
    max_tokens = _get(body, "max_completion_tokens", (int,)) or _get(body, "max_tokens", (int,), default_max_tokens)
    if max_tokens == 0:
        raise ApiError("'max_tokens' must be >= 1", param="max_tokens")
    want = bool(_get(body, "logprobs", (bool,), False))
    top = _get(body, "top_logprobs", (int,))
    if top is not None and not want:
        raise ApiError("'top_logprobs' requires 'logprobs': true", param="top_logprobs")
    params = _common_params(body, max_tokens, (top or 0) if want else None, False)
    as_ids = bool(_get(body, "return_tokens_as_token_ids", (bool,), False))
    stream, include_usage = _stream_flags(body)
    return ChatRequest(messages, params, top, as_ids, stream, include_usage)
