"""Teacher forcing: score the baseline's completions on a server with `echo`, so both arms
score identical tokens; and check first that a server's echo logprobs can be trusted (forcing/trust.py).

Exact tokens first ("ids"): when the baseline's generation came back as token ids (vLLM's
`return_tokens_as_token_ids`, which kvqual serve follows) and the scoring server renders
prompts to ids (vLLM's `/tokenize`, with `messages` for chat items), the request is prompt ids
+ the generated ids as a token-id prompt on `/v1/completions` with `echo` and `logprobs`; the
echoed ids are checked against those sent, and the completion is the positions after the
prompt. Nothing is re-tokenized. Text alignment ("text") is the fallback for completions items
on servers that offer neither: prompt text + completion text, the completion's tokens found by
`text_offset`; when they do not line up with the generated tokens (the boundary merged
differently), the item is left out and counted. Each Forced records its method, and the report
counts them. Results land in the baseline run's folder as `teacher-by-<scoring run id>.jsonl`.

Chunked forcing: a scoring request holds prompt + completion + the one token echo asks for, so a
long completion can exceed what the scoring server admits (its `max_model_len`, read from
`/v1/models`, or learnt from its refusal). Then the completion is scored in windows
(`chunk_windows`): each window is the whole prompt + as much of the completion before the tokens it
scores as fits; the first scores the completion's head with its full context, each later one the
next `stride` tokens, seeing at least half the window's completion room of preceding completion.
Exact up to the first window's end; past it a token's logprobs are conditioned on the prompt + the
last few hundred (or thousand) completion tokens, not the whole completion, at positions of the
window, not of the generation. Both servers score the same windows under the same limit, which the
compare gives every forcer of a comparison (`limit_to`: the smaller of the servers' limits); the item
records its windows (`Forced.chunks`), see docs/longgen.md.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, TypeVar

from kvqual.client import echo_payload, parse_echo
from kvqual.forced import FAILED, Forced, ForcedWriter, load_forced, one_writer
from kvqual.forcing.trust import (  # noqa: F401 - re-exported: the echo check is teacher forcing's first step
    ECHO_TRUST_ITEMS, ECHO_TRUST_MAX_MEAN_ABS, check_echo_trust, trust_sample)
from kvqual.records import Item, Sample, TokenLogprobs, refused_limit
from kvqual.retry import RetryPolicy, Sent
from kvqual.transport import Transport

T = TypeVar("T")

# Chunked forcing (docs/longgen.md): of a window's completion room, the least share that is context for
# the tokens it scores (0.5: each token sees at least half a window of preceding completion; every
# completion token is prefilled about 1 / (1 − share) = 2 times); windows need this much room at least.
CHUNK_CONTEXT_SHARE = 0.5
CHUNK_MIN_ROOM = 32
CHUNK_RETRIES = 3  # refusals for length that lower the learnt limit before the item is failed
Window = tuple[int, int, int]  # (context start, first scored, end): completion indices of one scoring request


def chunk_windows(prompt_len: int, completion_len: int, max_prompt: int | None,
                  share: float = CHUNK_CONTEXT_SHARE) -> list[Window] | str:
    """The scoring requests of one completion under a limit of `max_prompt` tokens per scoring
    prompt: [(a, s, e)] = send prompt + completion[a:e], keep the logprobs of completion[s:e]. One
    window (0, 0, C) when it fits. Otherwise the first window scores the head [0, room) with its
    full context (room = max_prompt − prompt_len), and each next one the following `stride` tokens
    with the most preceding completion that fits (a = e − room): every token sees the prompt and at
    least room − stride = ⌈share · room⌉ tokens of completion before it. The windows cover every
    completion position once, in order. A string says why it cannot be chunked."""
    if max_prompt is None or prompt_len + completion_len <= max_prompt:
        return [(0, 0, completion_len)]
    room = max_prompt - prompt_len
    if room < CHUNK_MIN_ROOM:
        return (f"prompt + completion ({prompt_len} + {completion_len} tokens) exceed what the server scores "
                f"in one request ({max_prompt} tokens), and the prompt leaves {max(room, 0)} tokens for windows of "
                f"the completion (fewer than {CHUNK_MIN_ROOM})")
    stride = max(1, room - math.ceil(share * room))
    windows: list[Window] = [(0, 0, room)]
    start = room
    while start < completion_len:
        end = min(completion_len, start + stride)
        windows.append((max(0, end - room), start, end))
        start = end
    return windows


def completion_slice(echo: TokenLogprobs, prompt_len: int, generated: TokenLogprobs | None,
                     end: int | None = None) -> tuple[TokenLogprobs | None, str | None]:
    """The echoed positions of the completion (text offsets in [prompt_len, end)), or (None, why
    they do not line up). `end`: the length of the text sent; positions from it on are tokens the
    server generated after the echo (max_tokens=1) when it did not report usage."""
    if echo.text_offset is None or any(off < 0 for off in echo.text_offset):  # SGLang's OpenAI echo: -1
        return None, "server returned no text_offset"
    if end is not None:
        stop = next((i for i, off in enumerate(echo.text_offset) if off >= end), len(echo.tokens))
        echo = TokenLogprobs(tokens=echo.tokens[:stop], token_logprobs=echo.token_logprobs[:stop],
                             top_logprobs=echo.top_logprobs[:stop], text_offset=echo.text_offset[:stop])
    start = next((i for i, off in enumerate(echo.text_offset) if off >= prompt_len), len(echo.tokens))
    if start > 0 and echo.text_offset[start - 1] + len(echo.tokens[start - 1]) > prompt_len:
        return None, "prompt/completion boundary merged into one token"
    part = TokenLogprobs(tokens=echo.tokens[start:], token_logprobs=echo.token_logprobs[start:],
                         top_logprobs=echo.top_logprobs[start:], text_offset=echo.text_offset[start:])
    if not part.tokens:
        return None, "empty completion"
    if generated is not None:
        gen = generated.tokens
        if tuple(gen[: len(part.tokens)]) != part.tokens or len(gen) - len(part.tokens) > 1:
            return None, "re-tokenized completion differs from the generated tokens"
    if any(lp is None for lp in part.token_logprobs) or len(part.top_logprobs) != len(part.tokens):
        return None, "missing logprobs inside the completion"
    return part, None


class TeacherForcer:
    """Echo-scores prompt + completion on one server (completions API, text prompts). Every request
    (echo, /tokenize, /v1/models) goes through its one transport under the runner's retry policy;
    `requests`, `retried` (attempts after a failure) and `reconnects` count what they cost."""

    def __init__(self, base_url: str, api_key: str, model: str, top_logprobs: int, timeout: float,
                 concurrency: int, retries: int = 5) -> None:
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self.top_logprobs, self.timeout, self.retries = top_logprobs, timeout, retries
        self.transport = Transport(base_url, api_key, timeout)
        self.policy = RetryPolicy(retries)
        self.semaphore = asyncio.Semaphore(concurrency)  # every request of this forcer, /tokenize included
        self._rendered: dict[str, asyncio.Task] = {}  # one /tokenize per item, however many passes ask
        self._rng = random.Random(0)
        self.requests = self.retried = self.reconnects = 0  # requests sent, attempts after a failure, reconnects
        # tokens scored through the KV cache (SGLang's steps, forcing/sglang.py), and those of them whose step
        # found its prefix recomputed instead of cached; 0 where the engine scores through the cache anyway
        self.cache_scored = self.cache_missed = 0
        self.step = 0  # tokens scored a request through the cache (SglangForcer); 0: a sequence in one request
        self.salt: str | None = None  # set: every echo carries a cache_salt of its own (`salted`)
        self._salts = itertools.count()
        self._limit: asyncio.Task | None = None  # the server's max_model_len, asked once
        self.max_prompt: int | None = None  # tokens one scoring prompt may hold, once known (limit_to)

    def limit_to(self, max_prompt: int | None) -> "TeacherForcer":
        """Score in windows of at most `max_prompt` prompt tokens (chunk_windows), whatever the server
        reports: give every server of a comparison the smallest limit among them, so both score the
        same windows. None: the server's own limit (`/v1/models` max_model_len − 1)."""
        self.max_prompt = max_prompt
        return self

    async def prompt_limit(self) -> int | None:
        """The most tokens a scoring prompt may hold: set by `limit_to` or learnt from a refusal, else
        the server's `max_model_len` (vLLM's /v1/models, kvqual serve's, SGLang's) less the one token
        echo generates; None when the server states none (then a refusal teaches it)."""
        if self.max_prompt is not None:
            return self.max_prompt
        if self._limit is None:
            self._limit = asyncio.ensure_future(self._models_limit())
        reported = await self._limit
        return self.max_prompt if self.max_prompt is not None else reported

    async def _models_limit(self) -> int | None:
        sent = await self._send(lambda: self.transport.get_json("/models"))
        data = sent.value.get("data") if isinstance(sent.value, Mapping) else None
        for model in data if isinstance(data, list) else []:
            n = model.get("max_model_len") if isinstance(model, Mapping) else None
            if isinstance(n, int) and not isinstance(n, bool) and n > 1 and (
                    not self.model or model.get("id") in (self.model, None) or len(data) == 1):
                return n - 1  # echo asks for one generated token (echo_payload): prompt + 1 ≤ max_model_len
        return None

    def salted(self, prefix: str) -> "TeacherForcer":
        """Give every echo request a `cache_salt` of its own (vLLM's field), so that scoring neither
        reads nor writes the shared prefix-cache namespace: the cache probe needs the candidate's
        first use of a prefix to be its generation, not an echo sent beside it (docs/cache.md)."""
        self.salt = prefix
        return self

    async def _send(self, call: Callable[[], Awaitable[T]]) -> Sent[T]:
        """`call` under the concurrency bound (not held while backing off) and the retry policy:
        a close before any response is a reconnect, transient failures are retried."""
        async def bounded() -> T:
            async with self.semaphore:
                return await call()

        sent = await self.policy.send(bounded, self._rng)
        self.requests += 1
        self.retried += sent.attempts - 1
        self.reconnects += sent.reconnects
        return sent

    async def _tokenize(self, body: dict[str, Any]) -> list[int] | None:
        """vLLM's POST /tokenize → its `tokens` (ids); None when the server does not offer it."""
        sent = await self._send(lambda: self.transport.post_json("/tokenize", {"model": self.model, **body},
                                                                 at_root=True))
        tokens = sent.value.get("tokens") if isinstance(sent.value, Mapping) else None
        if isinstance(tokens, list) and tokens and all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            return tokens
        return None

    async def prompt_ids(self, item: Item) -> list[int] | None:
        """The prompt as the server's token ids: chat items rendered by its chat template (vLLM's
        /tokenize with `messages` and the assistant turn opened), text prompts tokenized as its
        completions endpoint tokenizes them; None when the server offers no such /tokenize."""
        if item.api == "completions" and isinstance(item.prompt, tuple):
            return list(item.prompt)
        key = f"{item.suite}\x00{item.id}"
        if key not in self._rendered:
            body: dict[str, Any]
            if item.api == "chat":
                body = {"messages": [dict(m) for m in item.messages or ()], "add_generation_prompt": True}
            else:
                body = {"prompt": item.prompt}
            self._rendered[key] = asyncio.ensure_future(self._tokenize(body))
        return await self._rendered[key]

    async def completion_ids(self, text: str) -> list[int] | None:
        """A completion's text as this server's token ids, without special tokens (`kvqual audit`: outputs
        saved as text); None when the server offers no /tokenize, or the text is empty."""
        return await self._tokenize({"prompt": text, "add_special_tokens": False}) if text else None

    async def force(self, item: Item, sample: Sample) -> Forced:
        """One baseline completion scored on this server: exact token ids where both the generation
        and this server allow it, else text alignment (completions items only). A request that fails
        for good is recorded as a failed item (left out of token metrics, counted with its reason)."""
        generated = sample.logprobs.token_ids if sample.logprobs is not None else None
        if generated is not None:
            ids = await self.prompt_ids(item)
            if ids is not None:
                return await self._force_ids(sample, ids, list(generated))
        if item.api == "chat":
            why = ("chat prompt cannot be rendered to token ids (server has no /tokenize taking messages)"
                   if generated is not None else
                   "chat completion came back without token ids (the baseline server did not return tokens as "
                   "ids), so it cannot be forced exactly")
            return Forced(sample.suite, sample.id, sample.repeat, False, why, None)
        if not isinstance(item.prompt, str):
            return Forced(sample.suite, sample.id, sample.repeat, False,
                          "token-id prompt, but the completion came back without token ids", None)
        prompt = item.prompt
        full = prompt + (sample.text or "")
        echo = await self._echo(full)
        if isinstance(echo, str):
            if refused_limit(echo) is not None:  # final, not a failure to retry: text cannot be cut into windows
                echo = ("prompt + completion are longer than the server scores in one request, and text "
                        f"alignment cannot score it in windows (that needs token ids): {echo.removeprefix(FAILED + ': ')}")
            return Forced(sample.suite, sample.id, sample.repeat, False, echo, None)
        part, why = completion_slice(echo, len(prompt), sample.logprobs, end=len(full))
        return Forced(sample.suite, sample.id, sample.repeat, part is not None, why, part, "text")

    async def _echo(self, prompt: str | list[int]) -> TokenLogprobs | str:
        """Echo-score `prompt` on /v1/completions: its per-position logprobs, or why not (a request
        that failed for good, or an answer that is not data: a string starting with FAILED, so the
        next pass asks again)."""
        body = echo_payload(prompt, self.model, self.top_logprobs)
        if self.salt is not None:
            body["cache_salt"] = f"{self.salt}:{next(self._salts)}"

        async def echo() -> TokenLogprobs:  # an answer that is not data fails like a request: not retried
            return parse_echo(await self.transport.post_json("/completions", body), self.base_url)

        sent = await self._send(echo)
        if sent.failure is not None:
            return f"{FAILED}: {sent.failure.message}"
        return sent.value  # type: ignore[return-value] - answered: the value is there

    async def score_ids(self, ids: list[int]) -> TokenLogprobs | str:
        """Logprobs of every position of a token-id prompt (position 0 may be None), tokens as ids;
        or why not (a failed request). vLLM's way: `/v1/completions` with the ids as the prompt,
        `echo`, `logprobs` and `return_tokens_as_token_ids`. Engines with their own scoring
        endpoint override this (SGLang's native /generate)."""
        return await self._echo(ids)

    async def _force_ids(self, sample: Sample, prompt: list[int], completion: list[int]) -> Forced:
        """Score prompt ids + the generated ids as token-id prompts; the completion is the positions
        after the prompt, checked id for id against what was sent. In one request where it fits the
        server's limit, else in windows (chunk_windows; a refusal for length lowers the limit and plans
        again)."""
        def out(aligned: bool, why: str | None, lp: TokenLogprobs | None = None,
                chunks: Mapping[str, Any] | None = None) -> Forced:
            return Forced(sample.suite, sample.id, sample.repeat, aligned, why, lp, "ids" if aligned else None,
                          chunks if aligned else None)

        if sample.prompt_tokens is not None and sample.prompt_tokens != len(prompt):
            return out(False, f"the prompt renders to {len(prompt)} token ids here but the generation saw "
                              f"{sample.prompt_tokens} (another chat template or tokenizer)")
        if not completion:
            return out(False, "empty completion")
        for _ in range(CHUNK_RETRIES + 1):
            limit = await self.prompt_limit()
            plan = chunk_windows(len(prompt), len(completion), limit)
            if isinstance(plan, str):
                return out(False, plan)
            parts: list[TokenLogprobs] = []
            refused: int | None = None
            for a, start, end in plan:
                part = await self._score_window(prompt, completion, a, start, end)
                if isinstance(part, str):
                    refused = refused_limit(part)
                    if refused is None or (limit is not None and refused - 1 >= limit):
                        return out(False, part)  # not a refusal for length, or one the plan already obeyed
                    break
                parts.append(part)
            if refused is not None:
                self.max_prompt = refused - 1 if self.max_prompt is None else min(self.max_prompt, refused - 1)
                continue
            chunks = None if len(plan) == 1 else {"max_prompt": limit, "windows": [list(w) for w in plan]}
            return out(True, None, concat_parts(parts), chunks)
        return out(False, f"{FAILED}: the server kept refusing windows as too long (last limit {self.max_prompt})")

    async def _score_window(self, prompt: list[int], completion: list[int], a: int, start: int,
                            end: int) -> TokenLogprobs | str:
        """prompt + completion[a:end] scored; the logprobs of completion[start:end], or why not."""
        sent = prompt + completion[a:end]
        echo = await self.score_ids(sent)
        if isinstance(echo, str):
            return echo
        if echo.token_ids is None:
            return "the server did not return token ids for a token-id prompt"
        if tuple(echo.token_ids[: len(sent)]) != tuple(sent):
            return "the server echoed other token ids than were sent"
        n, m = len(prompt) + start - a, len(sent)
        part = TokenLogprobs(tokens=echo.tokens[n:m], token_logprobs=echo.token_logprobs[n:m],
                             top_logprobs=echo.top_logprobs[n:m], token_ids=echo.token_ids[n:m])
        return whole_part(part, end - start)

    def through_cache_note(self) -> str:
        """", N tokens scored through the KV cache (M of them against recomputed K/V)", or "" where none were."""
        if not self.cache_scored:
            return ""
        return (f", {self.cache_scored} tokens scored through the KV cache"
                + (f" ({self.cache_missed} of them found their prefix evicted and recomputed)" if self.cache_missed else ""))

    async def aclose(self) -> None:
        await self.transport.aclose()


def whole_part(part: TokenLogprobs, want: int) -> TokenLogprobs | str:
    """A window's scored positions, or why not: every one of the `want` positions has a logprob and its top."""
    if (any(lp is None for lp in part.token_logprobs) or len(part.top_logprobs) != len(part.tokens)
            or len(part.tokens) != want):
        return "missing logprobs inside the completion"
    return part


def concat_parts(parts: list[TokenLogprobs]) -> TokenLogprobs:
    """The windows' scored positions as one completion (in order; one window is itself)."""
    if len(parts) == 1:
        return parts[0]
    return TokenLogprobs(tokens=tuple(t for p in parts for t in p.tokens),
                         token_logprobs=tuple(x for p in parts for x in p.token_logprobs),
                         top_logprobs=tuple(x for p in parts for x in p.top_logprobs),
                         token_ids=tuple(x for p in parts for x in p.token_ids or ()))


async def force_all(forcer: TeacherForcer, items: Mapping[tuple[str, str], Item], samples: list[Sample],
                    out: Path, on_done: Callable[[], None] | None = None) -> list[Forced]:
    """Teacher-force every sample not already in `out` (JSONL), appending each result the moment it
    completes (one flushed line), so an interrupted pass keeps what it scored and the next pass asks
    only for the rest: a sequential compare forces each round's items once. Failed ones are asked
    again. Returns the Forced of `samples`, in their order. `on_done` is called per record written."""
    with one_writer(out):
        return await _force_all(forcer, items, samples, out, on_done)


async def _force_all(forcer: TeacherForcer, items: Mapping[tuple[str, str], Item], samples: list[Sample],
                     out: Path, on_done: Callable[[], None] | None) -> list[Forced]:
    done = {k: f for k, f in load_forced(out, logprobs=False).items() if not (f.reason or "").startswith(FAILED)}
    todo = [s for s in samples if s.key not in done and (s.suite, s.id) in items]  # failed ones are asked again
    if todo:
        with ForcedWriter(out, keep=done) as writer:
            async def one(sample: Sample) -> None:
                f = await forcer.force(items[(sample.suite, sample.id)], sample)
                writer.write(f)  # no await inside: on one event loop each record lands whole (single writer)
                done[(f.suite, f.id, f.repeat)] = f
                if on_done is not None:
                    on_done()

            tasks = [asyncio.ensure_future(one(s)) for s in todo]
            try:
                await asyncio.gather(*tasks)
            except BaseException:  # a contract error (or a cancel): stop the rest before the file closes
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
    return [done[s.key] for s in samples if s.key in done]
