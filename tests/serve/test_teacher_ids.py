"""Exact-token teacher forcing against the reference server, which follows vLLM's shapes:
generation returns tokens as ids, /tokenize renders chat messages to ids, and a token-id prompt
with echo scores exactly the ids that were generated (no re-tokenization)."""

import asyncio

import httpx
import pytest

from kvqual.client import chat_payload, completion_payload, parse_chat, parse_completion
from kvqual.forcing.teacher import TeacherForcer, check_echo_trust
from kvqual.records import GenerationParams, Item, Sample

from logprob_gaps import SAME_PATH_SHARE

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
CHAT = Item(id="c1", suite="s", messages=({"role": "user", "content": "Name three colours of the rainbow."},),
            max_tokens=24)
TEXT = Item(id="t1", suite="s", prompt="The capital of France is", max_tokens=12)
PARAMS = GenerationParams(max_tokens=24, top_logprobs=5, token_ids=True)


def _generate(url: str, item: Item) -> Sample:
    if item.api == "chat":
        data = httpx.post(url + "/v1/chat/completions", json=chat_payload(item, PARAMS, MODEL), timeout=120).json()
        answer = parse_chat(data, PARAMS.top_logprobs)
    else:
        data = httpx.post(url + "/v1/completions", json=completion_payload(item, PARAMS, MODEL), timeout=120).json()
        answer = parse_completion(data, PARAMS.top_logprobs)
    return Sample(id=item.id, suite=item.suite, repeat=0, text=answer.text, finish_reason=answer.finish_reason,
                  completion_tokens=answer.completion_tokens, error=None, prompt_tokens=answer.prompt_tokens,
                  logprobs=answer.logprobs)


async def _force(url: str, pairs: list[tuple[Item, Sample]]):
    forcer = TeacherForcer(url + "/v1", "", MODEL, top_logprobs=5, timeout=120, concurrency=4)
    try:
        return [await forcer.force(item, sample) for item, sample in pairs]
    finally:
        await forcer.aclose()


def test_generation_returns_ids_and_forcing_scores_exactly_those_ids(bf16_url, fp8_url):
    samples = [_generate(bf16_url, CHAT), _generate(bf16_url, TEXT)]
    for s in samples:
        assert s.logprobs is not None and s.logprobs.token_ids is not None
        assert all(t == f"token_id:{i}" for t, i in zip(s.logprobs.tokens, s.logprobs.token_ids))
    pairs = list(zip([CHAT, TEXT], samples))
    own = asyncio.run(_force(bf16_url, pairs))
    for sample, forced in zip(samples, own):
        assert forced.aligned and forced.method == "ids", forced.reason
        assert forced.logprobs.token_ids == sample.logprobs.token_ids  # the chat item too: no text involved
    # another server scores the same ids; its distributions differ a little (fp8 K/V), never its tokens
    other = asyncio.run(_force(fp8_url, pairs))
    for sample, forced in zip(samples, other):
        assert forced.aligned and forced.method == "ids"
        assert forced.logprobs.token_ids == sample.logprobs.token_ids
        assert all(set(t) and all(k.startswith("token_id:") for k in t) for t in forced.logprobs.top_logprobs)
    # the server's own outputs re-scored in one prefill agree with what it reported while decoding: by
    # less than a share of fp8's rounding noise on the same tokens (logprob_gaps.py), not a fixed figure
    mean = check_echo_trust(list(zip(samples, own)), bf16_url)
    fp8_vs_bf16 = [abs(a - b) for f, o in zip(other, own)
                   for a, b in zip(f.logprobs.token_logprobs, o.logprobs.token_logprobs, strict=True)]
    noise = sum(fp8_vs_bf16) / len(fp8_vs_bf16)
    print(f"bf16 echo vs generation: mean |Δ logprob| {mean:.5f}; fp8's rounding noise {noise:.4f} "
          f"over {len(fp8_vs_bf16)} tokens")
    assert mean is not None and mean <= SAME_PATH_SHARE * noise, (mean, noise)


def test_a_prompt_that_renders_to_other_ids_is_left_out_with_why(bf16_url):
    sample = _generate(bf16_url, CHAT)
    other = Item(id="c1", suite="s", messages=({"role": "user", "content": "A different question, with many more words in it than the one the answer was generated for?"},))
    (forced,) = asyncio.run(_force(bf16_url, [(other, sample)]))
    assert not forced.aligned and "renders to" in forced.reason
