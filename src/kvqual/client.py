"""The one transport (openai.AsyncOpenAI on aiohttp) plus pure payload builders and parsers.

Payloads are plain dicts and responses are parsed from the server's JSON, not from the SDK's
pydantic models: fields that servers add (vLLM/SGLang token ids, prompt logprobs) stay
visible, parsing is cheap, and every shape is tested by asserting on exact dicts.

Garbage is not data: a body over `MAX_RESPONSE_BYTES`, a non-finite number (JSON has none), a
missing or non-numeric logprob of a generated token, or an answer from another model than the
one asked for raises `InvalidResponse` — one failed request with its reason, never an answer.
Failure messages never carry a configured API key (`errors.redact`).
"""

from __future__ import annotations

import dataclasses
import email.utils
import functools
import json
import math
import operator
import random
import re
import sys
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import httpx
import orjson

from kvqual.errors import InvalidResponse, ServerContractError, redact, register_secret
from kvqual.records import GenerationParams, Item, TokenLogprobs

TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids format
# One response body (a stream: all its chunks) at most. vLLM's completions logprobs take ~230 bytes a
# token at top-5 and ~750 at top-20, so this holds a 128K-token echo at top-5 or a 64K one at top-20;
# a bigger body is a failed request, and is not read further (memory stays bounded at any concurrency).
MAX_RESPONSE_BYTES = 64 * 1024 * 1024


# ---------------------------------------------------------------- payloads (pure)

# what generation sends when the engine can give token ids back (exact teacher forcing)
ASK_FOR_IDS = {
    "return_tokens_as_token_ids": True,  # vLLM, kvqual serve: logprob tokens as "token_id:N"
    "return_token_ids": True,  # SGLang (and vLLM ≥ 0.10): choices[0].token_ids beside text tokens
}

def completion_payload(item: Item, params: GenerationParams, model: str, repeat: int = 0,
                       cache_salt: str | None = None) -> dict[str, Any]:
    """/v1/completions body for one item. Repeats > 0 shift the seed so samples differ. `cache_salt`
    (vLLM's field, kvqual serve's too): a prefix-caching server shares cached blocks only between
    requests with the same salt, so a salt of its own makes a request compute its prompt fresh."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(item.prompt) if isinstance(item.prompt, tuple) else item.prompt,
        "max_tokens": item.max_tokens or params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": params.seed + repeat,
    }
    if params.top_logprobs > 0:
        body["logprobs"] = params.top_logprobs
        if params.token_ids:
            body.update(ASK_FOR_IDS)
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


def chat_payload(item: Item, params: GenerationParams, model: str, repeat: int = 0,
                 cache_salt: str | None = None) -> dict[str, Any]:
    """/v1/chat/completions body for one item (`cache_salt` as in `completion_payload`)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [dict(m) for m in item.messages or ()],
        "max_tokens": item.max_tokens or params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": params.seed + repeat,
    }
    if params.top_logprobs > 0:
        body["logprobs"] = True
        body["top_logprobs"] = params.top_logprobs
        if params.token_ids:
            body.update(ASK_FOR_IDS)
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body


def stream_payload(body: Mapping[str, Any]) -> dict[str, Any]:
    """The same request, streamed, with the usage chunk at the end (OpenAI/vLLM/SGLang)."""
    return {**body, "stream": True, "stream_options": {"include_usage": True}}


def echo_payload(prompt: str | list[int], model: str, top_logprobs: int) -> dict[str, Any]:
    """Teacher forcing: score `prompt` (text or token ids) with echo. `max_tokens` is 1, the convention
    the engines agree on (lm-eval sends the same): some servers refuse 0, and llama.cpp's reads it as
    "up to the context length". The one generated token is dropped by `parse_echo`. A token-id
    prompt asks for tokens as ids too (vLLM's `return_tokens_as_token_ids`), so what was scored can
    be checked id for id against what was sent."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": 1,
        "echo": True,
        "temperature": 0.0,
        "logprobs": max(1, top_logprobs),
    }
    if isinstance(prompt, list):
        body["return_tokens_as_token_ids"] = True
    return body


# ---------------------------------------------------------------- parsers (pure)

def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"{text[:20]} overflows to infinity")
    return value


def decode_json(raw: bytes, server: str = "server") -> Any:
    """A response body as JSON; NaN / Infinity (which Python's encoder writes and JSON does not
    have) and numbers that overflow are `InvalidResponse`, as is a body that is not JSON.

    orjson first (5x the standard decoder on a 256 x top-5 answer): it is strict JSON, so it
    refuses NaN, Infinity and every number, integer or not, that is infinite as a double. What
    it refuses goes through the standard decoder with the hooks, which names what is wrong (or
    accepts what is valid JSON to it alone: a UTF-16 body, a lone surrogate escape), so what is
    accepted and every message are those of the standard decoder alone."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidResponse(f"{server}: malformed response: {redact(str(exc))[:200]}") from None


# OpenAI's API answers a model alias with a dated snapshot: gpt-4o → gpt-4o-2024-08-06, gpt-4 → gpt-4-0613
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{4})")


def check_model(requested: Any, data: Any, server: str = "server") -> None:
    """The answer names the model that was asked for (or OpenAI's dated snapshot of it); another
    model's answer is `InvalidResponse`. A body without `model` is taken at its word."""
    returned = data.get("model") if isinstance(data, Mapping) else None
    if not isinstance(requested, str) or not requested or returned in (None, ""):
        return
    if returned == requested or (isinstance(returned, str) and returned.startswith(requested)
                                 and _SNAPSHOT.fullmatch(returned[len(requested):])):
        return
    raise InvalidResponse(f"{server}: answered by model {redact(str(returned))[:100]!r}, "
                          f"not the requested {requested!r}")


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    logprobs: TokenLogprobs | None
    cached_tokens: int | None = None  # prompt tokens served from the server's prefix cache, where it says


def _usage(data: Mapping[str, Any]) -> tuple[int | None, int | None]:
    usage = data.get("usage") or {}
    return usage.get("prompt_tokens"), usage.get("completion_tokens")


def cached_tokens(data: Mapping[str, Any]) -> int | None:
    """Prompt tokens served from the prefix cache: `usage.prompt_tokens_details.cached_tokens` (OpenAI's
    shape; vLLM with --enable-prompt-tokens-details, SGLang with --enable-cache-report, kvqual serve),
    or SGLang's native `meta_info.cached_tokens`. None where the server does not say."""
    details = (data.get("usage") or {}).get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if value is None:
        meta = data.get("meta_info")
        value = meta.get("cached_tokens") if isinstance(meta, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _first_choice(data: Mapping[str, Any], server: str) -> Mapping[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerContractError(f"{server}: response has no choices: {redact(str(data))[:200]}")
    return choices[0]


def token_id_of(token: str) -> int | None:
    """The id in vLLM's `token_id:123` token strings, else None."""
    if token.startswith(TOKEN_ID_PREFIX):
        rest = token[len(TOKEN_ID_PREFIX):]
        if rest.isdigit():
            return int(rest)
    return None


_JOINED_IDS = re.compile(r"token_id:[0-9]+(?:\ttoken_id:[0-9]+)*\Z")


def _token_ids(tokens: tuple[str, ...]) -> tuple[int, ...] | None:
    """The ids of tokens that are all `token_id:N`, else None. Every answer comes through here:
    the common cases take C-speed passes (the first token is not an id; or one regex over the
    joined tokens), and only what those cannot decide takes `token_id_of` token by token."""
    if not tokens:
        return None
    strings = set(map(type, tokens)) <= _STR
    if strings and not tokens[0].startswith(TOKEN_ID_PREFIX):
        return None
    if strings:
        joined = "\t".join(tokens)
        if _JOINED_IDS.match(joined) is not None:
            parts = joined.replace(TOKEN_ID_PREFIX, "").split("\t")
            if len(parts) == len(tokens):  # else a tab inside a token: not ids
                return tuple(map(int, parts))
    ids = [token_id_of(t) for t in tokens]
    return tuple(ids) if all(i is not None for i in ids) else None  # type: ignore[arg-type]


_STR = frozenset((str,))
_DICT = frozenset((dict,))


def _top_maps(tops: list[Any]) -> tuple[Mapping[str, float], ...]:
    """The top-k maps of a decoded body, kept as they are (nothing else holds them: no copies);
    a null or empty entry is an empty map, as is anything else falsy."""
    if set(map(type, tops)) <= _DICT:
        return tuple(tops)
    return tuple(dict(t) if t else {} for t in tops)


def _completion_logprobs(raw: Mapping[str, Any] | None) -> TokenLogprobs | None:
    if not raw or raw.get("tokens") is None:
        return None
    tokens = tuple(raw["tokens"])
    return TokenLogprobs(
        tokens=tokens,
        token_logprobs=tuple(raw.get("token_logprobs") or ()),
        top_logprobs=_top_maps(raw.get("top_logprobs") or ()),
        text_offset=tuple(raw["text_offset"]) if raw.get("text_offset") is not None else None,
        token_ids=_token_ids(tokens),
    )


def _with_choice_token_ids(lp: TokenLogprobs | None, choice: Mapping[str, Any]) -> TokenLogprobs | None:
    """`return_token_ids` (SGLang's OpenAI adapter, vLLM): the generated ids in `choices[0].token_ids`
    beside text logprob tokens; used when the tokens themselves are not ids and the counts agree."""
    ids = choice.get("token_ids")
    if (lp is None or lp.token_ids is not None or not isinstance(ids, list) or len(ids) != len(lp.tokens)
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        return lp
    return dataclasses.replace(lp, token_ids=tuple(ids))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_NUMBER_TYPES = frozenset((int, float))
_not_none = functools.partial(operator.is_not, None)


def _all_finite(values: Sequence[Any], nulls: bool) -> bool:
    """Every value an int or a float (or null, with `nulls`) and finite, in C-level passes over
    the list: a NaN or ±inf anywhere makes the sum NaN or ±inf. False means "look one by one"
    (a bool, a str, a float subclass, a sum that overflowed), never that all is well."""
    vals = list(filter(_not_none, values)) if nulls else values
    try:
        return set(map(type, vals)) <= _NUMBER_TYPES and math.isfinite(sum(vals))
    except OverflowError:  # an int too big for a float: the one-by-one check says which
        return False


def check_finite(lp: TokenLogprobs, server: str, nulls: bool = False) -> None:
    """Every logprob (scored token and top-k) is a finite number — vLLM's -9999.0 for -inf is one;
    NaN, ±inf, a string (or null, unless `nulls`) is `InvalidResponse`. Echo has nulls: the first
    prompt token has no logprob, and `teacher.completion_slice` reports one inside the completion.
    Every answer goes through here (256 tokens × top-5 is 1,536 values), so the common case, all
    finite, is checked in bulk first (on `lp.top_values`, the chained list the token row then
    reuses); the loops below only run to name what is wrong."""
    if _all_finite(lp.token_logprobs, nulls) and _all_finite(lp.top_values, nulls):
        return
    ok = (lambda v: v is None or _is_number(v)) if nulls else _is_number
    for i, value in enumerate(lp.token_logprobs):
        if not ok(value):
            raise InvalidResponse(f"{server}: logprob of token {i} is {value!r}, not a finite number")
    for i, top in enumerate(lp.top_logprobs):
        for value in top.values():
            if not ok(value):
                raise InvalidResponse(f"{server}: a top logprob of token {i} is {value!r}, not a finite number")


def _check_logprobs(lp: TokenLogprobs | None, want: int, n_tokens: int | None, server: str) -> None:
    """A server that silently drops logprobs must stop the run, never be scored as data; one that
    sends a non-finite logprob fails that request."""
    if lp is not None:
        check_finite(lp, server)
    if want <= 0:
        return
    if lp is None:
        raise ServerContractError(f"{server}: logprobs were requested but the response has none "
                                  "(does the server support `logprobs`?)")
    if len(lp.token_logprobs) != len(lp.tokens):
        raise ServerContractError(f"{server}: {len(lp.tokens)} tokens but {len(lp.token_logprobs)} logprobs")
    if n_tokens is not None and len(lp.tokens) != n_tokens:
        raise ServerContractError(f"{server}: usage says {n_tokens} completion tokens but logprobs cover "
                                  f"{len(lp.tokens)}")


def parse_completion(data: Mapping[str, Any], want_logprobs: int, server: str = "server") -> Answer:
    choice = _first_choice(data, server)
    prompt_tokens, completion_tokens = _usage(data)
    lp = _with_choice_token_ids(_completion_logprobs(choice.get("logprobs")), choice)
    _check_logprobs(lp, want_logprobs, completion_tokens, server)
    text = choice.get("text")
    if not isinstance(text, str):
        raise ServerContractError(f"{server}: completion choice has no text")
    return Answer(text, choice.get("finish_reason"), prompt_tokens, completion_tokens, lp, cached_tokens(data))


def parse_chat(data: Mapping[str, Any], want_logprobs: int, server: str = "server") -> Answer:
    choice = _first_choice(data, server)
    prompt_tokens, completion_tokens = _usage(data)
    message = choice.get("message") or {}
    text = message.get("content")
    if text is None:
        text = ""  # a tool call or an empty turn; the length (0) is still data
    lp = None
    content = (choice.get("logprobs") or {}).get("content")
    if content is not None:
        tokens = tuple(c["token"] for c in content)
        ids = [token_id_of(t) for t in tokens]
        lp = TokenLogprobs(
            tokens=tokens,
            token_logprobs=tuple(c.get("logprob") for c in content),
            top_logprobs=tuple({t["token"]: t["logprob"] for t in c.get("top_logprobs") or ()} for c in content),
            token_ids=tuple(ids) if tokens and all(i is not None for i in ids) else None,  # type: ignore[arg-type]
        )
    lp = _with_choice_token_ids(lp, choice)
    _check_logprobs(lp, want_logprobs, completion_tokens, server)
    return Answer(text, choice.get("finish_reason"), prompt_tokens, completion_tokens, lp, cached_tokens(data))


def parse_echo(data: Mapping[str, Any], server: str = "server") -> TokenLogprobs:
    """Prompt logprobs from an echo request; missing or short data is a contract error."""
    choice = _first_choice(data, server)
    lp = _completion_logprobs(choice.get("logprobs"))
    prompt_tokens, _ = _usage(data)
    if lp is None or not lp.tokens:
        raise ServerContractError(f"{server}: echo returned no prompt logprobs (teacher forcing needs "
                                  "`echo` with `logprobs`; pass --no-teacher-forcing to skip it)")
    check_finite(lp, server, nulls=True)
    if len(lp.token_logprobs) != len(lp.tokens) or (prompt_tokens is not None and len(lp.tokens) < prompt_tokens):
        raise ServerContractError(f"{server}: echo returned {len(lp.token_logprobs)} logprobs for "
                                  f"{prompt_tokens if prompt_tokens is not None else len(lp.tokens)} prompt tokens")
    if prompt_tokens is not None and len(lp.tokens) > prompt_tokens:  # the generated token(s) after the prompt
        lp = TokenLogprobs(tokens=lp.tokens[:prompt_tokens], token_logprobs=lp.token_logprobs[:prompt_tokens],
                           top_logprobs=lp.top_logprobs[:prompt_tokens],
                           text_offset=lp.text_offset[:prompt_tokens] if lp.text_offset is not None else None,
                           token_ids=lp.token_ids[:prompt_tokens] if lp.token_ids is not None else None)
    return lp


# ---------------------------------------------------------------- streams (pure)

def _usage_of(chunks: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    return next((c["usage"] for c in reversed(chunks) if c.get("usage")), None)


def _choice0(chunk: Mapping[str, Any]) -> Mapping[str, Any] | None:
    choices = chunk.get("choices") or []
    return next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)


def merge_completion_stream(chunks: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Streamed /v1/completions chunks → the non-streamed response body they add up to."""
    text: list[str] = []
    lp: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    has_lp, has_offsets, finish = False, True, None
    ids: list[int] | None = None
    for chunk in chunks:
        choice = _choice0(chunk)
        if choice is None:
            continue
        ids = _more_ids(ids, choice)
        text.append(choice.get("text") or "")
        finish = choice.get("finish_reason") or finish
        part = choice.get("logprobs")
        if part and part.get("tokens") is not None:
            has_lp = True
            lp["tokens"] += part["tokens"]
            lp["token_logprobs"] += part.get("token_logprobs") or []
            lp["top_logprobs"] += part.get("top_logprobs") or [None] * len(part["tokens"])
            if part.get("text_offset") is None:
                has_offsets = False
            else:
                lp["text_offset"] += part["text_offset"]
    if not has_offsets:
        lp.pop("text_offset")
    choice_out = {"index": 0, "text": "".join(text), "finish_reason": finish, "logprobs": lp if has_lp else None}
    if ids is not None:
        choice_out["token_ids"] = ids
    return {"choices": [choice_out], "usage": _usage_of(chunks)}


def _more_ids(ids: list[int] | None, choice: Mapping[str, Any]) -> list[int] | None:
    """`return_token_ids` when streamed (vLLM, SGLang): each chunk's `token_ids` holds its new tokens."""
    part = choice.get("token_ids")
    if isinstance(part, list):
        return (ids or []) + part
    return ids


def merge_chat_stream(chunks: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Streamed chat.completion.chunk events → the non-streamed response body they add up to."""
    text: list[str] = []
    content: list[Any] = []
    has_lp, finish = False, None
    ids: list[int] | None = None
    for chunk in chunks:
        choice = _choice0(chunk)
        if choice is None:
            continue
        ids = _more_ids(ids, choice)
        text.append((choice.get("delta") or {}).get("content") or "")
        finish = choice.get("finish_reason") or finish
        part = (choice.get("logprobs") or {}).get("content")
        if part is not None:
            has_lp = True
            content += part
    message = {"role": "assistant", "content": "".join(text)}
    choice_out: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish,
                                  "logprobs": {"content": content} if has_lp else None}
    if ids is not None:
        choice_out["token_ids"] = ids
    return {"choices": [choice_out], "usage": _usage_of(chunks)}


def chunk_has_content(chunk: Mapping[str, Any], chat: bool) -> bool:
    """Does this chunk carry generated tokens (text or logprobs)? The first one marks TTFT."""
    choice = _choice0(chunk)
    if choice is None:
        return False
    if chat:
        return bool((choice.get("delta") or {}).get("content") or (choice.get("logprobs") or {}).get("content"))
    return bool(choice.get("text") or (choice.get("logprobs") or {}).get("tokens"))


def inter_token_latency(ttft: float | None, last: float | None, n_tokens: int | None) -> float | None:
    """Mean time between output tokens after the first (vLLM's TPOT): (last − first) / (n − 1)."""
    if ttft is None or last is None or not n_tokens or n_tokens < 2:
        return None
    return max(0.0, last - ttft) / (n_tokens - 1)


# ---------------------------------------------------------------- errors & retries

@dataclass(frozen=True)
class FailureInfo:
    transient: bool
    message: str
    retry_after: float | None = None


def retry_after_of(headers: Mapping[str, str] | None) -> float | None:
    """Seconds a Retry-After header (seconds or an HTTP date) asks to wait; None without one."""
    if not headers:
        return None
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def classify(exc: BaseException) -> FailureInfo:
    """Transient (retry): connection errors, timeouts, 408/409/429, 5xx. Anything else is final.
    The message is what gets stored: a configured API key in it (a server echoing the request's
    Authorization header in an error body) is replaced by *** before it is cut to length."""
    info = _classify(exc)
    return dataclasses.replace(info, message=redact(info.message))


def causes(exc: BaseException, during: bool = False) -> Iterator[BaseException]:
    """`exc` and what it was raised from (`during`: or raised while handling), outermost first — the
    SDK and its transport chain their errors with `raise ... from` — each once."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or (cause.__context__ if during else None)


def _connection_cause(exc: BaseException) -> BaseException | None:
    """The aiohttp connection error (refused, reset, closed) under an SDK "timeout", or None when
    it really timed out."""
    import aiohttp

    for cause in list(causes(exc, during=True))[1:]:
        if isinstance(cause, (aiohttp.ServerTimeoutError, TimeoutError)):
            return None
        if isinstance(cause, aiohttp.ClientConnectionError):
            return cause
    return None


def _classify(exc: BaseException) -> FailureInfo:
    if isinstance(exc, InvalidResponse):
        return FailureInfo(False, f"invalid response: {exc}")
    openai = sys.modules.get("openai")  # imported by the first Transport: no openai error exists before it
    if openai is not None:
        if isinstance(exc, openai.APITimeoutError):
            root = _connection_cause(exc)  # the SDK's aiohttp transport calls every connection error a timeout
            return FailureInfo(True, f"connection error: {type(root).__name__}: {root}" if root is not None else "timeout")
        if isinstance(exc, openai.APIConnectionError):
            return FailureInfo(True, f"connection error: {exc.__cause__ or exc}")
        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            body = exc.response.text if exc.response is not None else ""
            transient = status in (408, 409, 429) or status >= 500
            return FailureInfo(transient, f"HTTP {status}: {_body_head(body)}",
                               retry_after_of(exc.response.headers if exc.response is not None else None))
    if isinstance(exc, httpx.HTTPStatusError):  # raise_for_status() on a plain httpx request
        status = exc.response.status_code
        return FailureInfo(status in (408, 409, 429) or status >= 500, f"HTTP {status}: {_body_head(exc.response.text)}",
                           retry_after_of(exc.response.headers))
    if isinstance(exc, (httpx.TimeoutException,)):
        return FailureInfo(True, "timeout")
    if isinstance(exc, (httpx.TransportError, ConnectionError)):
        return FailureInfo(True, f"connection error: {exc}")
    if isinstance(exc, ValueError):  # a body that is not JSON
        return FailureInfo(False, f"malformed response: {exc}")
    return FailureInfo(False, f"{type(exc).__name__}: {exc}")


def _body_head(body: str) -> str:
    """The first 300 characters of an error body, with keys redacted first (a cut must not leave
    the start of a key behind)."""
    return redact(body)[:300]


def backoff_delay(attempt: int, rng: random.Random, base: float = 0.5, cap: float = 30.0,
                  retry_after: float | None = None) -> float:
    """Exponential backoff with full jitter; a server's Retry-After is honoured as a floor."""
    delay = rng.uniform(0, min(cap, base * 2 ** attempt))
    return max(delay, retry_after) if retry_after is not None else delay


# ---------------------------------------------------------------- transport

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy")


def _proxied() -> bool:
    """A proxy is set in the environment (the SDK's client honours it; the direct POST does not)."""
    import os

    return any(os.environ.get(v) or os.environ.get(v.upper()) for v in _PROXY_VARIABLES)


class Transport:
    """One AsyncOpenAI client per base URL (aiohttp backend), retries handled by the runner.

    The non-streamed POST to a plain-http server (`post_json`: every answer of a non-streamed run,
    every teacher-forcing echo) skips the SDK's request building (its options models, header
    merging, URL parsing and response wrapping were ~0.75 ms of client CPU a request, a third of
    kvqual's; docs/performance.md) and goes out on an aiohttp session of its own configured as the
    SDK's is (same headers, auth included; same body bytes; the same timeouts, connection limit,
    keep-alive and redirects). What comes back is what the SDK would give: the same openai
    exceptions, chained to the same aiohttp errors (`_sdk_error`), so `classify` and the runner's
    retry rules see no difference. Streamed requests, GETs, https targets and any target behind a
    proxy set in the environment go through the SDK as before."""

    def __init__(self, base_url: str, api_key: str, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        register_secret(api_key)  # whatever this client sends is scrubbed from failure messages
        # A plain-http server is never spoken TLS to (requests go under base_url; no redirect is
        # followed), so its client skips loading the CA bundle: ~90 ms of CPU every Transport.
        plain_http = self.base_url.lower().startswith("http://")
        import openai  # here, not at the top: commands that never send a request (report, --help) skip its ~1 s

        self._timeout = timeout
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=api_key or "EMPTY", timeout=timeout, max_retries=0,
            http_client=openai.DefaultAioHttpClient(timeout=timeout, verify=not plain_http),
        )
        self._direct = plain_http and "?" not in self.base_url and "#" not in self.base_url and not _proxied()
        self._session: Any = None  # the direct POST's aiohttp session, made in the loop that first posts
        self._headers: dict[str, str] | None = None

    async def post_json(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST `body` to `path` under the /v1 root; the parsed JSON, or an openai error, or
        `InvalidResponse` (over `MAX_RESPONSE_BYTES`, not JSON, non-finite, another model's)."""
        if self._direct:
            raw = await self._post_direct(path, body)
        else:
            response = await self._client.post(path, body=body, cast_to=httpx.Response, stream=True)
            try:
                raw = await _read_capped(response, self.base_url)
            finally:
                await response.aclose()
        data = decode_json(raw, self.base_url)
        check_model(body.get("model"), data, self.base_url)
        return data

    def _sdk_headers(self) -> dict[str, str]:
        """The headers the SDK sends with a POST (its defaults, auth, retry count 0, read timeout)
        plus httpx's Accept-Encoding and Connection; computed once, inside the event loop (one of
        them names it)."""
        if self._headers is None:
            headers = {k: v for k, v in {**self._client.default_headers, **self._client.auth_headers}.items()
                       if isinstance(v, str)}
            headers["x-stainless-retry-count"] = "0"
            headers["x-stainless-read-timeout"] = str(self._timeout)
            headers["Accept-Encoding"] = "gzip, deflate"
            headers["Connection"] = "keep-alive"
            self._headers = headers
        return self._headers

    async def _post_direct(self, path: str, body: Mapping[str, Any]) -> bytes:
        import aiohttp

        # the SDK's encoding of a body (openai._utils._json.openapi_dumps): NaN is refused before sending
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        url = f"{self.base_url}/{path.lstrip('/')}"
        if self._session is None:
            # the SDK's client: 1000 connections, 5 s keep-alive, no TLS on a plain-http target
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                limit=1000, keepalive_timeout=5.0, ssl=False))
        t = self._timeout
        try:
            response = await self._session.post(
                url, data=data, headers=self._sdk_headers(), max_redirects=20,
                timeout=aiohttp.ClientTimeout(sock_connect=t, sock_read=t, connect=t)).__aenter__()
        except Exception as exc:  # noqa: BLE001 - mapped to what the SDK raises for it
            mapped = _sdk_error(exc, url)
            if mapped is exc:
                raise
            raise mapped from exc
        try:
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
                raise InvalidResponse(_too_big(self.base_url))
            parts: list[bytes] = []
            size = 0
            try:
                async for part in response.content.iter_any():
                    size += len(part)
                    if size > MAX_RESPONSE_BYTES:
                        raise InvalidResponse(_too_big(self.base_url))
                    parts.append(part)
            except InvalidResponse:
                raise
            except Exception as exc:  # noqa: BLE001 - a body that breaks off, as `_read_capped` reports it
                raise _sdk_error(exc, url, reading=True) from exc
            raw = b"".join(parts)
            if not 200 <= response.status < 300:  # httpx's raise_for_status, under the SDK: 3xx not followed too
                raise _status_error(response, raw, url)
            return raw
        finally:
            response.release()

    async def post_stream(self, path: str, body: Mapping[str, Any], chat: bool) -> tuple[list[dict[str, Any]], float | None, float | None]:
        """POST a streamed request; (chunks, seconds to the first token, seconds to the last token)."""
        t0 = time.perf_counter()
        first = last = None
        chunks: list[dict[str, Any]] = []
        import openai  # loaded already: this Transport made its client with it

        stream = await self._client.post(path, body=stream_payload(body), cast_to=object, stream=True,
                                         stream_cls=openai.AsyncStream[object])
        try:
            async for chunk in stream:
                if not isinstance(chunk, dict):
                    raise ValueError(f"stream chunk is not a JSON object: {str(chunk)[:100]}")
                if stream.response.num_bytes_downloaded > MAX_RESPONSE_BYTES:
                    raise InvalidResponse(_too_big(self.base_url))
                if not chunks:
                    check_model(body.get("model"), chunk, self.base_url)
                if chunk_has_content(chunk, chat):
                    last = time.perf_counter() - t0
                    first = last if first is None else first
                chunks.append(chunk)
        finally:
            await stream.close()
        return chunks, first, last  # the SDK decodes SSE events, NaN included: the parsers check logprobs

    async def get_json(self, path: str) -> Any:
        response = await self._client.get(path, cast_to=httpx.Response)
        return response.json()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self._client.close()


def _sdk_error(exc: BaseException, url: str, reading: bool = False) -> BaseException:
    """What the SDK raises (with `from exc`) for an aiohttp error of its aiohttp transport: that
    transport maps every aiohttp connection error (timeouts, refusals, resets, disconnects) to an
    httpx timeout, which the SDK raises as APITimeoutError, and a broken payload or a bad URL to a
    request error, raised as APIConnectionError; anything else it lets through as it is. Reading
    the body (`reading`), every error that is not a timeout is APIConnectionError, as
    `_read_capped` says it. `classify` then finds the same aiohttp error under the same openai one."""
    import aiohttp
    import httpx2
    import openai

    request = httpx2.Request("POST", url)
    if isinstance(exc, aiohttp.ClientConnectionError):
        return openai.APITimeoutError(request=request)
    if reading:
        return openai.APIConnectionError(message=f"response broke off: {exc}", request=request)
    # httpx's own errors for a too long redirect chain or a URL it cannot send to are request errors too
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.TooManyRedirects, aiohttp.NonHttpUrlClientError,
                        aiohttp.InvalidUrlClientError)):
        return openai.APIConnectionError(request=request)
    return exc


def _status_error(response: Any, body: bytes, url: str) -> BaseException:
    """The SDK's APIStatusError for a response that is not 2xx: its status, headers and body (read
    already; decoded, so its Content-Encoding is dropped) are what `classify` reads."""
    import httpx2
    import openai

    headers = [(k, v) for k, v in response.raw_headers if k.lower() != b"content-encoding"]
    resp = httpx2.Response(response.status, headers=headers, content=body, request=httpx2.Request("POST", url))
    return openai.APIStatusError(f"Error code: {response.status}", response=resp, body=None)


def _too_big(server: str) -> str:
    return f"{server}: response body over {MAX_RESPONSE_BYTES // 2**20} MiB (MAX_RESPONSE_BYTES); not read further"


async def _read_capped(response: httpx.Response, server: str) -> bytes:
    """The body, at most MAX_RESPONSE_BYTES of it (a bigger one is `InvalidResponse`). A body that
    breaks off is a timeout or connection error, as the SDK reports it when it reads one itself."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise InvalidResponse(_too_big(server))
    parts: list[bytes] = []
    size = 0
    try:
        async for part in response.aiter_bytes():
            size += len(part)
            if size > MAX_RESPONSE_BYTES:
                raise InvalidResponse(_too_big(server))
            parts.append(part)
    except InvalidResponse:
        raise
    except Exception as exc:  # noqa: BLE001 - the transport's read errors (httpx2 under the SDK, aiohttp)
        import openai  # loaded already: only a Transport's responses come here

        if any(cls.__name__ == "TimeoutException" for cls in type(exc).__mro__):
            raise openai.APITimeoutError(request=response.request) from exc
        raise openai.APIConnectionError(message=f"response broke off: {exc}", request=response.request) from exc
    return b"".join(parts)

