"""Chunked teacher forcing: a completion longer than the scoring server admits in one request is
scored in windows (prompt + as much preceding completion as fits), against the fake server's
`--token-ids --max-model-len` (a character tokenizer whose logprobs depend on the last 40
characters, so a window with 40+ characters of context scores exactly what one request does)."""

import asyncio

import httpx
import pytest

from kvqual.client import completion_payload, parse_completion
from kvqual.forced import FAILED, Forced
from kvqual.forcing.teacher import CHUNK_CONTEXT_SHARE, CHUNK_MIN_ROOM, TeacherForcer, chunk_windows
from kvqual.records import GenerationParams, Item, Sample, refused_limit

MODEL = "fake-model"
PARAMS = GenerationParams(max_tokens=2000, top_logprobs=3, token_ids=True)
ITEM = Item(id="long", suite="s", prompt="Write at length about rivers", max_tokens=2000)


# ---------------------------------------------------------------- the plan (pure)

@pytest.mark.parametrize("prompt,completion,limit", [(10, 300, 110), (28, 700, 119), (1, 5000, 4095),
                                                     (50, 51, 100), (3, 1000, 36), (200, 20000, 8191)])
def test_windows_cover_every_completion_token_once_within_the_limit(prompt, completion, limit):
    plan = chunk_windows(prompt, completion, limit)
    assert isinstance(plan, list) and len(plan) > 1
    room = limit - prompt
    assert plan[0] == (0, 0, room)  # the head is scored with its whole context
    covered = []
    for a, s, e in plan:
        assert 0 <= a <= s < e <= completion
        assert prompt + (e - a) <= limit  # each request fits
        assert s - a >= (0 if s == 0 else -(-room * CHUNK_CONTEXT_SHARE // 1))  # ≥ ⌈share·room⌉ tokens before
        covered.extend(range(s, e))
    assert covered == list(range(completion))


def test_one_window_when_it_fits_or_no_limit_is_known():
    assert chunk_windows(10, 90, 100) == [(0, 0, 90)]
    assert chunk_windows(10, 90_000, None) == [(0, 0, 90_000)]


def test_a_prompt_that_leaves_no_room_cannot_be_chunked():
    why = chunk_windows(100, 500, 100 + CHUNK_MIN_ROOM - 1)
    assert isinstance(why, str) and "leaves 31 tokens" in why


def test_the_limit_a_refusal_states():
    vllm = ("HTTP 400: {\"error\":{\"message\":\"This model's maximum context length is 4096 tokens. However, you "
            "requested 1 output tokens and your prompt contains at least 4097 input tokens, for a total of at least "
            "4098 tokens.\",\"type\":\"BadRequestError\"}}")
    engine = "HTTP 400: The decoder prompt (length 5000) is longer than the maximum model length of 2048. Make sure"
    sglang = "HTTP 400: The input (9000 tokens) is longer than the model's context length (8192 tokens)."
    serve = ("HTTP 400: {\"error\": {\"message\": \"This model's maximum context length is 8192 tokens; the prompt has "
             "9000 tokens and max_tokens is 1.\", \"code\": \"context_length_exceeded\"}}")
    assert [refused_limit(m) for m in (vllm, engine, sglang, serve)] == [4096, 2048, 8192, 8192]
    assert refused_limit("HTTP 400: bad request") is None
    assert refused_limit("timeout") is None and refused_limit(None) is None
    assert refused_limit(f"{FAILED}: HTTP 500: maximum context length is 4 tokens") is None  # not a refusal


# ---------------------------------------------------------------- against the fake server

def _generate(url: str, item: Item = ITEM, params: GenerationParams = PARAMS) -> Sample:
    data = httpx.post(url + "/completions", json=completion_payload(item, params, MODEL), timeout=30).json()
    answer = parse_completion(data, params.top_logprobs)
    return Sample(id=item.id, suite=item.suite, repeat=0, text=answer.text, finish_reason=answer.finish_reason,
                  completion_tokens=answer.completion_tokens, error=None, prompt_tokens=answer.prompt_tokens,
                  logprobs=answer.logprobs)


def _force(url: str, sample: Sample, item: Item = ITEM, limit: int | None = None, no_models: bool = False) -> Forced:
    async def go() -> Forced:
        forcer = TeacherForcer(url, "", MODEL, top_logprobs=3, timeout=30, concurrency=4)
        if limit is not None:
            forcer.limit_to(limit)
        if no_models:  # the server reports no limit: only its refusal can teach it
            async def none() -> None:
                return None
            forcer._models_limit = none  # type: ignore[method-assign]
        try:
            return await forcer.force(item, sample)
        finally:
            await forcer.aclose()
    return asyncio.run(go())


@pytest.fixture
def long_sample(fake_server) -> tuple[str, Sample]:
    gen = fake_server("--token-ids", "--answer-tokens", "700")
    sample = _generate(gen.base_url)
    assert sample.logprobs is not None and sample.logprobs.token_ids is not None
    assert sample.completion_tokens == 700 and sample.prompt_tokens == len(ITEM.prompt)
    return gen.base_url, sample


def test_a_long_completion_is_scored_in_windows_where_the_server_limits_it(fake_server, long_sample):
    gen_url, sample = long_sample
    whole = _force(gen_url, sample)  # no limit: one request
    assert whole.aligned and whole.method == "ids" and whole.chunks is None
    small = fake_server("--token-ids", "--max-model-len", "160")
    forced = _force(small.base_url, sample)
    assert forced.aligned and forced.method == "ids", forced.reason
    assert forced.chunks is not None and forced.chunks["max_prompt"] == 159  # max_model_len − echo's one token
    windows = forced.chunks["windows"]
    room = 159 - len(ITEM.prompt)
    assert windows[0] == [0, 0, room] and windows[-1][2] == 700 and len(windows) == 1 + -(-(700 - room) // (room // 2))
    # every token scored once, the ids those generated; with ≥ 40 characters of context the fake scores
    # exactly what one request does
    assert forced.logprobs.token_ids == sample.logprobs.token_ids
    assert forced.logprobs.token_logprobs == whole.logprobs.token_logprobs
    assert forced.logprobs.top_logprobs == whole.logprobs.top_logprobs
    # the record says how it was chunked, and reads back the same
    again = Forced.from_json(forced.to_json())
    assert again.chunks == {"max_prompt": 159, "windows": windows} and again.logprobs == forced.logprobs
    assert "chunks" not in whole.to_json()  # unchunked records keep their bytes


def test_the_limit_is_learnt_from_a_refusal_when_the_server_reports_none(fake_server, long_sample):
    _, sample = long_sample
    hidden = fake_server("--token-ids", "--max-model-len", "200", "--hide-max-model-len")
    forced = _force(hidden.base_url, sample, no_models=True)
    assert forced.aligned, forced.reason
    assert forced.chunks["max_prompt"] == 199 and forced.logprobs.token_ids == sample.logprobs.token_ids


def test_limit_to_gives_servers_of_one_comparison_the_same_windows(fake_server, long_sample):
    gen_url, sample = long_sample
    small = fake_server("--token-ids", "--max-model-len", "300")
    a = _force(gen_url, sample, limit=150)  # the generating server has no limit; the other's is applied
    b = _force(small.base_url, sample, limit=150)
    assert a.chunks == b.chunks and a.chunks["max_prompt"] == 150
    assert a.logprobs.token_logprobs == b.logprobs.token_logprobs


def test_a_prompt_too_long_for_windows_is_left_out_with_why(fake_server, long_sample):
    _, sample = long_sample
    tiny = fake_server("--token-ids", "--max-model-len", "40")
    forced = _force(tiny.base_url, sample)
    assert not forced.aligned and forced.logprobs is None and not forced.reason.startswith(FAILED)
    assert "fewer than 32" in forced.reason


def test_text_alignment_cannot_chunk_and_says_so_without_counting_a_failure(fake_server):
    words = fake_server("--answer-tokens", "300")
    params = GenerationParams(max_tokens=400, top_logprobs=3)
    item = Item(id="t", suite="s", prompt="Tell me about rivers", max_tokens=400)
    sample = _generate(words.base_url, item, params)
    assert sample.logprobs.token_ids is None
    limited = fake_server("--answer-tokens", "300", "--max-model-len", "100")
    forced = _force(limited.base_url, sample, item)
    assert not forced.aligned and not forced.reason.startswith(FAILED)
    assert "cannot score it in windows" in forced.reason and "maximum context length is 100" in forced.reason
