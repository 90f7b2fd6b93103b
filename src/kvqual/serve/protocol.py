"""OpenAI-compatible request validation and response shaping (pure functions, no I/O).

Requests are checked (serve/parsing.py) and turned into frozen values (vLLM's `cache_salt` included);
anything malformed raises `ApiError`, which the HTTP layer returns as an OpenAI-style error
body. Responses are plain dicts in OpenAI's exact shapes so that the `openai` client parses
them (with a prefix cache, `usage.prompt_tokens_details.cached_tokens`); streamed responses
are the same shapes cut into chunks by `StreamChunker` (Server-Sent Events).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Callable, Sequence

from kvqual.serve.engine import Generation
# request validation: its own module, its names here too
from kvqual.serve.parsing import (  # noqa: F401
    MAX_LOGPROBS, ApiError, ChatRequest, CompletionRequest, check_model, parse_chat, parse_completion,
    parse_messages)
from kvqual.serve.sampling import TokenLogprob


class TokenText:
    """Token id -> display string (each token decoded alone), or `token_id:<id>` as vLLM does."""

    def __init__(self, pieces: Sequence[str], as_token_ids: bool):
        self.pieces, self.as_token_ids = pieces, as_token_ids

    def __call__(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_token_ids else self.pieces[token_id]


def completion_logprobs(
    entries: Sequence[TokenLogprob | None], token_ids: Sequence[int], name: TokenText, start_offset: int
) -> dict[str, Any]:
    """OpenAI's legacy logprobs block; `entries[i]` None gives a null (the first echoed token)."""
    tokens, token_lp, top_lp, offsets = [], [], [], []
    offset = start_offset
    for token_id, entry in zip(token_ids, entries):
        text = name(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(name.pieces[token_id])
        token_lp.append(None if entry is None else entry.logprob)
        top_lp.append(None if entry is None else {name(t): lp for t, lp in entry.top})
    return {"tokens": tokens, "token_logprobs": token_lp, "top_logprobs": top_lp, "text_offset": offsets}


def completion_response(
    req: CompletionRequest, prompt_texts: Sequence[str], results: Sequence[Generation], model: str, pieces: Sequence[str]
) -> dict[str, Any]:
    """The /v1/completions response for all prompts, in request order."""
    name = TokenText(pieces, req.as_token_ids)
    choices = []
    for i, (prompt_text, res) in enumerate(zip(prompt_texts, results)):
        text = prompt_text + res.text if req.params.echo else res.text
        logprobs = None
        if req.params.logprobs is not None:
            ids, entries, start = list(res.output_ids), list(res.output_logprobs or ()), 0
            if req.params.echo:
                ids = list(res.prompt_ids) + ids
                entries = list(res.prompt_logprobs or ()) + entries
            logprobs = completion_logprobs(entries, ids, name, start)
        choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": res.finish_reason})
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": _usage(results),
    }


def _usage(results: Sequence[Generation]) -> dict[str, Any]:
    """OpenAI's usage block; `prompt_tokens_details.cached_tokens` where the server has a prefix cache."""
    prompt = sum(len(r.prompt_ids) for r in results)
    completion = sum(len(r.output_ids) for r in results)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion}
    if any(r.cached_tokens is not None for r in results):
        usage["prompt_tokens_details"] = {"cached_tokens": sum(r.cached_tokens or 0 for r in results)}
    return usage


def _chat_entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat_logprobs(entries: Sequence[TokenLogprob], token_ids: Sequence[int], name: TokenText) -> dict[str, Any]:
    """The chat logprobs block: one {token, logprob, bytes, top_logprobs} per token."""
    content = []
    for token_id, entry in zip(token_ids, entries):
        item = _chat_entry(name(token_id), entry.logprob)
        item["top_logprobs"] = [_chat_entry(name(t), lp) for t, lp in entry.top]
        content.append(item)
    return {"content": content}


def chat_response(req: ChatRequest, res: Generation, model: str, pieces: Sequence[str]) -> dict[str, Any]:
    """The /v1/chat/completions response."""
    name = TokenText(pieces, req.as_token_ids)
    logprobs = None
    if req.params.logprobs is not None:
        logprobs = chat_logprobs(res.output_logprobs or (), res.output_ids, name)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": res.text},
                "logprobs": logprobs,
                "finish_reason": res.finish_reason,
            }
        ],
        "usage": _usage([res]),
    }


# ---- streaming: Server-Sent Events ------------------------------------------------------

SSE_DONE = "data: [DONE]\n\n"


def sse_event(payload: dict[str, Any]) -> str:
    """One Server-Sent Event carrying a JSON payload."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def stream_error(message: str) -> dict[str, Any]:
    """The event sent when a stream fails after it started; the stream then ends without [DONE]."""
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


def releasable_text(text: str, stops: Sequence[str]) -> str:
    """The part of the text so far that later tokens cannot change: cut at the first stop string,
    else without a trailing incomplete UTF-8 character (U+FFFD) or a tail that may begin a stop string."""
    hits = [text.find(s) for s in stops if s and s in text]
    if hits:
        return text[: min(hits)]
    text = text.rstrip("\ufffd")
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), hold, -1):
            if text.endswith(s[:n]):
                hold = n
                break
    return text[: len(text) - hold]


class DeltaText:
    """A generation's text released in deltas as tokens arrive; the deltas add up to the final text.

    Decodes all tokens so far each time (as the engine does for stop strings), so a delta is
    always a prefix-stable piece of what the non-streamed response says.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str]):
        self._decode, self._stops = decode, tuple(s for s in stops if s)
        self._ids: list[int] = []
        self.sent = ""

    def push(self, token_id: int) -> str:
        """Add a token; the newly releasable text (often "" while a stop string may be forming)."""
        self._ids.append(token_id)
        safe = releasable_text(self._decode(self._ids), self._stops)
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent) :], safe
        return delta

    def finish(self, final_text: str) -> str:
        """The rest of the engine's final text (authoritative: it applied the stop strings)."""
        if not final_text.startswith(self.sent):
            raise ValueError("streamed text is not a prefix of the final text")
        delta, self.sent = final_text[len(self.sent) :], final_text
        return delta


class StreamChunker:
    """One request's engine events → OpenAI stream chunks (completions or chat), as plain dicts.

    With logprobs, every token gets its own chunk carrying its logprobs (held-back text comes
    later); without, tokens that release no text fold into the next chunk. The last content
    chunk carries the rest of the text and the finish reason, then comes the usage chunk if
    asked. Concatenated, the chunks give the non-streamed response's text and logprobs.
    """

    def __init__(
        self,
        req: CompletionRequest | ChatRequest,
        model: str,
        pieces: Sequence[str],
        decode: Callable[[Sequence[int]], str],
    ):
        self.chat = isinstance(req, ChatRequest)
        self.want_logprobs = req.params.logprobs is not None
        self.include_usage = req.include_usage
        self.name = TokenText(pieces, req.as_token_ids)
        self.text = DeltaText(decode, req.params.stop)
        kind, prefix = ("chat.completion.chunk", "chatcmpl") if self.chat else ("text_completion", "cmpl")
        self.base = {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}
        self._ids: list[int] = []  # tokens not yet sent in a chunk
        self._entries: list[TokenLogprob] = []
        self._offset = 0  # text_offset of the next token (completions)

    def start(self) -> list[dict[str, Any]]:
        """Chunks sent before the first token: chat's role chunk."""
        if not self.chat:
            return []
        return [self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None})]

    def token(self, token_id: int, entry: TokenLogprob | None, finish_reason: str | None) -> list[dict[str, Any]]:
        """Chunks for one generated token (none while waiting for the end of the request)."""
        self._ids.append(token_id)
        if entry is not None:
            self._entries.append(entry)
        if finish_reason is not None:
            return []  # its text and finish reason go out with `done`
        delta = self.text.push(token_id)
        if not delta and not self.want_logprobs:
            return []
        return [self._content(delta, None)]

    def done(self, result: Generation) -> list[dict[str, Any]]:
        """The last content chunk (rest of the text, finish reason), then usage if asked."""
        chunks = [self._content(self.text.finish(result.text), result.finish_reason)]
        if self.include_usage:
            chunks.append({**self.base, "choices": [], "usage": _usage([result])})
        return chunks

    def _content(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        logprobs = None
        if self.want_logprobs and self.chat:
            logprobs = chat_logprobs(self._entries, self._ids, self.name)
        elif self.want_logprobs:
            logprobs = completion_logprobs(self._entries, self._ids, self.name, self._offset)
            self._offset += sum(len(self.name.pieces[t]) for t in self._ids)
        self._ids, self._entries = [], []
        body = {"delta": {"content": text}} if self.chat else {"text": text}
        return self._chunk({"index": 0, **body, "logprobs": logprobs, "finish_reason": finish_reason})

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        chunk = {**self.base, "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI: every other chunk says usage null when usage is asked
        return chunk
