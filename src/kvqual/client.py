"""Pure payload builders and response parsers around the one transport (`transport.py`).

Payloads are plain dicts and responses are parsed from the server's JSON, not from the SDK's
pydantic models: fields that servers add (vLLM/SGLang token ids, prompt logprobs) stay
visible, parsing is cheap, and every shape is tested by asserting on exact dicts.

Garbage is not data: a missing or non-numeric logprob of a generated token raises
`InvalidResponse` (one failed request with its reason, never an answer); a server that drops data
kvqual needs (no logprobs, no choices) is a `ServerContractError`. Messages never carry a
configured API key (`errors.redact`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from kvqual.errors import InvalidResponse, ServerContractError, redact
from kvqual.records import GenerationParams, Item, TokenLogprobs

TOKEN_ID_PREFIX = "token_id:"  # vLLM's return_tokens_as_token_ids format


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
