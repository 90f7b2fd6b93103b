"""Streaming bridge: engine-thread token events → an asyncio.Queue → Server-Sent Events.

The engine calls `TokenEvents.on_token` / `on_done` on its worker thread; they hand each
event to the server's event loop with `call_soon_threadsafe`. A client that goes away
closes the events: its request still runs to the end in the engine, its output is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

from kvqual.serve.engine import Engine, Generation, SamplingParams
from kvqual.serve.protocol import SSE_DONE, StreamChunker, sse_event, stream_error
from kvqual.serve.sampling import TokenLogprob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenEvent:
    """One generated token as the engine reported it."""

    token_id: int
    logprob: TokenLogprob | None
    finish_reason: str | None


class TokenEvents:
    """The events of one streamed request, delivered from the engine thread into an asyncio.Queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue[TokenEvent | Generation | BaseException] = asyncio.Queue()
        self._closed = False

    def on_token(self, token_id: int, logprob: TokenLogprob | None, finish_reason: str | None) -> None:
        """Engine thread: a token was generated."""
        self._post(TokenEvent(token_id, logprob, finish_reason))

    def on_done(self, result: Generation | BaseException) -> None:
        """Engine thread: the request finished (or failed)."""
        self._post(result)

    def _post(self, item: TokenEvent | Generation | BaseException) -> None:
        if self._closed:
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self._closed = True

    async def get(self) -> TokenEvent | Generation | BaseException:
        """The next event, in the order the engine produced them."""
        return await self._queue.get()

    def close(self) -> None:
        """Stop delivering (the client went away or the stream ended)."""
        self._closed = True


async def sse_stream(
    engine: Engine,
    ids: Sequence[int],
    params: SamplingParams,
    chunker: StreamChunker,
) -> AsyncIterator[str]:
    """Submit one prompt and yield its chunks as SSE lines, then `[DONE]` (or an error event)."""
    events = TokenEvents(asyncio.get_running_loop())
    engine.submit(ids, params, events.on_done, on_token=events.on_token)
    try:
        for chunk in chunker.start():
            yield sse_event(chunk)
        while True:
            item = await events.get()
            if isinstance(item, BaseException):
                yield sse_event(stream_error(f"generation failed: {item}"))
                return
            try:
                if isinstance(item, TokenEvent):
                    chunks = chunker.token(item.token_id, item.logprob, item.finish_reason)
                else:
                    chunks = chunker.done(item)
            except Exception as exc:  # a shaping bug ends this stream with an error, not the server
                log.exception("stream shaping failed")
                yield sse_event(stream_error(f"stream failed: {exc}"))
                return
            for chunk in chunks:
                yield sse_event(chunk)
            if isinstance(item, Generation):
                yield SSE_DONE
                return
    finally:
        events.close()
