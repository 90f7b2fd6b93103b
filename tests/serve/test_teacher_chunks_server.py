"""Chunked teacher forcing on the reference server: a completion longer than a server's
`--context-length` admits is scored in windows; the first window scores what one request does (up
to prefill numerics), the later ones (a truncated context) differ by what this test prints."""

import asyncio
import math

import httpx
import pytest

from kvqual.client import chat_payload, parse_chat
from kvqual.forced import Forced
from kvqual.forcing.teacher import TeacherForcer
from kvqual.records import GenerationParams, Item, Sample

from logprob_gaps import SAME_PATH_SHARE, token_gap

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
ITEM = Item(id="story", suite="s", max_tokens=240,
            messages=({"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."},))
PARAMS = GenerationParams(max_tokens=240, top_logprobs=5, token_ids=True)
LIMIT = 160  # the small server's --context-length: the story's prompt + completion do not fit


@pytest.fixture(scope="module")
def small_url():
    from kvqual.serve import running_server

    with running_server(kv_cache_dtype="bf16", port=0, max_batch=4, context_length=LIMIT) as url:
        yield url


def _generate(url: str) -> Sample:
    data = httpx.post(url + "/v1/chat/completions", json=chat_payload(ITEM, PARAMS, MODEL), timeout=300).json()
    a = parse_chat(data, PARAMS.top_logprobs)
    return Sample(id=ITEM.id, suite=ITEM.suite, repeat=0, text=a.text, finish_reason=a.finish_reason,
                  completion_tokens=a.completion_tokens, error=None, prompt_tokens=a.prompt_tokens, logprobs=a.logprobs)


def _force(url: str, sample: Sample) -> Forced:
    async def go() -> Forced:
        forcer = TeacherForcer(url + "/v1", "", MODEL, top_logprobs=5, timeout=300, concurrency=2)
        try:
            return await forcer.force(ITEM, sample)
        finally:
            await forcer.aclose()
    return asyncio.run(go())


def _kl(p: dict[str, float], q: dict[str, float]) -> float:
    """KL over p's top-k (q's missing tokens at its smallest listed probability): a rough gauge."""
    floor = min(q.values())
    return sum(math.exp(lp) * (lp - q.get(t, floor)) for t, lp in p.items())


def test_a_completion_past_the_context_length_is_scored_in_windows(bf16_url, fp8_url, small_url, capsys):
    sample = _generate(bf16_url)
    assert sample.prompt_tokens + sample.completion_tokens > LIMIT, "the story must not fit the small server"
    whole = _force(bf16_url, sample)
    assert whole.aligned and whole.chunks is None
    chunked = _force(small_url, sample)
    assert chunked.aligned and chunked.method == "ids", chunked.reason
    assert chunked.chunks["max_prompt"] == LIMIT - 1  # read from /v1/models max_model_len
    room = LIMIT - 1 - sample.prompt_tokens
    assert chunked.chunks["windows"][0] == [0, 0, room]
    assert chunked.logprobs.token_ids == sample.logprobs.token_ids  # every generated token, once, in order
    a, b = whole.logprobs.token_logprobs, chunked.logprobs.token_logprobs
    head = [abs(x - y) for x, y in zip(a[:room], b[:room])]
    tail = [abs(x - y) for x, y in zip(a[room:], b[room:])]
    kl_tail = [_kl(p, q) for p, q in zip(whole.logprobs.top_logprobs[room:], chunked.logprobs.top_logprobs[room:])]
    with capsys.disabled():  # the cost of a truncated context, quoted in docs/longgen.md
        print(f"\nchunked forcing: prompt {sample.prompt_tokens}, completion {sample.completion_tokens}, "
              f"{len(chunked.chunks['windows'])} windows of ≤ {LIMIT - 1} tokens; |Δ logprob| head mean "
              f"{sum(head) / len(head):.2e} max {max(head):.2e}, "
              f"tail mean {sum(tail) / len(tail):.4f} max {max(tail):.3f}; tail KL(whole‖chunked) mean "
              f"{sum(kl_tail) / len(kl_tail):.4f}; same top-1 in the tail "
              f"{sum(max(p, key=p.get) == max(q, key=q.get) for p, q in zip(whole.logprobs.top_logprobs[room:], chunked.logprobs.top_logprobs[room:])) / len(tail):.3f}")
    # the first window holds the same context as one request: only the prefill's numerics differ (another
    # sequence length, other matmul blocking, by how much depends on the CPU's kernels), far below what
    # fp8 rounding moves the same tokens, measured here (logprob_gaps.py)
    fp8 = _force(fp8_url, sample)
    assert fp8.aligned and fp8.chunks is None
    noise = token_gap(fp8.logprobs.token_logprobs[:room], a[:room])
    with capsys.disabled():
        print(f"head: mean |Δ logprob| {sum(head) / len(head):.2e} against fp8's rounding noise {noise:.4f} "
              f"over the same {room} tokens")
    assert sum(head) / len(head) <= SAME_PATH_SHARE * noise
    assert tail and sum(tail) / len(tail) > sum(head) / len(head)  # later windows do see less context
