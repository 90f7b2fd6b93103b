"""Teacher forcing sends under the runner's retry policy (issue 34): a server that closes kept-alive
connections before responding costs reconnects, never attempts, so an item is scored even with no
retries left; one that always closes fails after bounded reconnects and retries, with why."""

import asyncio

from kvtest import LoopbackServer
from kvqual.forced import FAILED
from kvqual.forcing.teacher import TeacherForcer
from kvqual.retry import CLOSED_BEFORE_RESPONSE, MAX_RECONNECTS


def _echo(body: dict) -> dict:
    """vLLM's echo of a token-id prompt: every prompt position as `token_id:N`, then one generated token."""
    ids = list(body["prompt"]) + [9]
    return {"model": "m", "choices": [{"index": 0, "text": "", "finish_reason": "length", "logprobs": {
        "tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [None] + [-0.5] * (len(ids) - 1),
        "top_logprobs": [None] + [{f"token_id:{i}": -0.5} for i in ids[1:]], "text_offset": list(range(len(ids)))}}],
        "usage": {"prompt_tokens": len(ids) - 1, "completion_tokens": 1}}


def _score(server: LoopbackServer, n: int, retries: int) -> tuple[list, TeacherForcer]:
    async def go() -> tuple[list, TeacherForcer]:
        forcer = TeacherForcer(server.base_url, "", "m", top_logprobs=1, timeout=10, concurrency=1, retries=retries)
        try:
            return [await forcer.score_ids([1, 2, 3 + i]) for i in range(n)], forcer
        finally:
            await forcer.aclose()

    return asyncio.run(go())


def test_a_server_closing_reused_connections_costs_reconnects_not_attempts():
    server = LoopbackServer(close="reused", answer=_echo)
    scored, forcer = _score(server, 12, retries=0)
    assert [s.token_ids for s in scored] == [(1, 2, 3 + i) for i in range(12)]  # every one, no retry to spend
    # every request after the first found its connection closed once and went again on a new one
    assert server.closed == 11 and server.posts == 23
    assert (forcer.requests, forcer.retried, forcer.reconnects) == (12, 0, 11)


def test_a_server_that_always_closes_fails_the_item_after_bounded_reconnects_and_retries():
    server = LoopbackServer(close="always", answer=_echo)
    (reason,), forcer = _score(server, 1, retries=1)
    assert reason == f"{FAILED}: {CLOSED_BEFORE_RESPONSE} (after {MAX_RECONNECTS} reconnects)"
    assert (forcer.retried, forcer.reconnects, server.posts) == (1, MAX_RECONNECTS, 2 + MAX_RECONNECTS)
