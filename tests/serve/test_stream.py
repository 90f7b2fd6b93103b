"""Streaming: the asyncio bridge against a fake engine thread (fast), then the real model over HTTP (slow)."""

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest

from kvqual.serve.engine import Generation, SamplingParams
from kvqual.serve.protocol import StreamChunker, parse_completion
from kvqual.serve.stream import TokenEvents, sse_stream

MODEL = "SmolLM2-135M-Instruct"
PIECES = ["Hel", "lo", " there", "!"]


class FakeEngine:
    """Reports tokens from its own thread as the engine does; `fail_at` fails the request at that token."""

    def __init__(self, ids, fail_at=None, delay=0.0, gate=None):
        self.ids, self.fail_at, self.delay, self.gate = ids, fail_at, delay, gate
        self.errors: list[BaseException] = []
        self.thread: threading.Thread | None = None

    def submit(self, prompt_ids, params, callback, on_token=None):
        def run():
            try:
                for i, t in enumerate(self.ids):
                    time.sleep(self.delay)
                    if i == self.fail_at:
                        callback(RuntimeError("boom"))
                        return
                    on_token(t, None, "length" if i == len(self.ids) - 1 else None)
                    if i == 0 and self.gate is not None and not self.gate.wait(timeout=5):
                        callback(RuntimeError("the first token was not delivered on its own"))
                        return
                text = "".join(PIECES[t] for t in self.ids)
                callback(Generation(tuple(prompt_ids), tuple(self.ids), text, "length", None, None))
            except BaseException as exc:  # what the real engine would have to swallow
                self.errors.append(exc)

        self.thread = threading.Thread(target=run)
        self.thread.start()


def _events(engine, n_tokens=4, close_after=None, on_event=lambda: None):
    req = parse_completion({"prompt": "p", "max_tokens": n_tokens, "stream": True}, "m")
    chunker = StreamChunker(req, "m", PIECES, lambda ids: "".join(PIECES[i] for i in ids))

    async def collect():
        out = []
        stream = sse_stream(engine, [1, 2], SamplingParams(max_tokens=n_tokens), chunker)
        async for event in stream:
            out.append(event)
            on_event()
            if len(out) == close_after:
                await stream.aclose()  # what Starlette does when the client hangs up
                break
        return out

    return asyncio.run(collect())


def test_bridge_streams_every_token_then_done():
    events = _events(FakeEngine([0, 1, 2, 3]))
    assert events[-1] == "data: [DONE]\n\n" and all(e.startswith("data: {") and e.endswith("\n\n") for e in events[:-1])
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks] == ["Hel", "lo", " there", "!"]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, None, "length"]


def test_first_token_is_delivered_before_the_next_is_generated():
    gate = threading.Event()
    engine = FakeEngine([0, 1, 2, 3], gate=gate)  # holds token 2 until the consumer has seen token 1
    events = _events(engine, on_event=gate.set)
    assert len(events) == 5 and engine.errors == []


def test_failure_after_start_is_an_error_event_and_no_done():
    events = _events(FakeEngine([0, 1, 2, 3], fail_at=2))
    assert len(events) == 3 and json.loads(events[0][len("data: "):])["choices"][0]["text"] == "Hel"
    error = json.loads(events[-1][len("data: "):])["error"]
    assert error["type"] == "server_error" and "boom" in error["message"]


def test_gone_client_does_not_disturb_the_engine_thread():
    engine = FakeEngine([0, 1, 2, 3, 0, 1, 2, 3], delay=0.02)
    events = _events(engine, n_tokens=8, close_after=1)
    assert len(events) == 1
    engine.thread.join(timeout=10)  # it kept reporting after the close, and after the loop closed
    assert not engine.thread.is_alive() and engine.errors == []


def test_events_after_the_loop_closed_are_dropped():
    loop = asyncio.new_event_loop()
    events = TokenEvents(loop)
    loop.close()
    events.on_token(1, None, None)
    events.on_done(RuntimeError("late"))


# ---- the real model over HTTP --------------------------------------------------------

PROMPT = "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg"
LIVE_TOKENS = 24  # a streamed request long enough that its first chunk arrives well before its last token


def _metric(url, name):
    text = httpx.get(url + "/metrics").text
    line = next(l for l in text.splitlines() if l.startswith(f"kvqual_serve:{name}{{"))
    return float(line.rsplit(" ", 1)[1])


def _sse(url, path, body, on_first=lambda: None):
    """POST a streamed request; its JSON events (`on_first` runs at the first), the SSE framing checked."""
    events, buf = [], ""
    with httpx.stream("POST", url + path, json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for text in r.iter_text():
            buf += text
            while "\n\n" in buf:
                event, buf = buf.split("\n\n", 1)
                assert event.startswith("data: ")
                events.append(event[len("data: "):])
                if len(events) == 1:
                    on_first()
    assert buf == "" and events[-1] == "[DONE]"
    return [json.loads(data) for data in events[:-1]]


@pytest.mark.slow
def test_streamed_completion_matches_non_streamed(bf16_url):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": LIVE_TOKENS, "temperature": 0, "logprobs": 2,
            "return_tokens_as_token_ids": True}
    whole = httpx.post(bf16_url + "/v1/completions", json=body, timeout=120).json()
    before, at_first = _metric(bf16_url, "generation_tokens_total"), []
    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    *content, usage = _sse(bf16_url, "/v1/completions", stream,
                           on_first=lambda: at_first.append(_metric(bf16_url, "generation_tokens_total")))
    choices = [chunk["choices"][0] for chunk in content]
    expected = whole["choices"][0]
    assert expected["finish_reason"] == "length" and expected["logprobs"]["tokens"][0].startswith("token_id:")
    assert "".join(c["text"] for c in choices) == expected["text"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for c in choices for x in c["logprobs"][key]] == expected["logprobs"][key]
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]
    assert usage["choices"] == [] and usage["usage"] == whole["usage"] == {
        "prompt_tokens": whole["usage"]["prompt_tokens"], "completion_tokens": LIVE_TOKENS,
        "total_tokens": whole["usage"]["prompt_tokens"] + LIVE_TOKENS}
    # delivered per decode step, not all at the end: one chunk per token, the first while the
    # engine had still to generate the rest (LIVE_TOKENS - 1 more steps, each a read of all the weights:
    # many times one local /metrics call on any CPU, however fast)
    assert len(choices) == LIVE_TOKENS and sum(bool(c["text"]) for c in choices) >= 2
    print(f"tokens generated when the first chunk arrived: {at_first[0] - before:.0f} of {LIVE_TOKENS}")
    assert at_first[0] - before < LIVE_TOKENS


@pytest.mark.slow
def test_streamed_chat_matches_non_streamed(bf16_url):
    c = openai.OpenAI(base_url=bf16_url + "/v1", api_key="none", max_retries=0)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Name three colors."}], max_tokens=8,
               temperature=0, logprobs=True, top_logprobs=2)
    whole = c.chat.completions.create(**ask).choices[0]
    chunks = list(c.chat.completions.create(**ask, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert all(ch.choices and ch.usage is None for ch in chunks)  # no usage chunk unless asked
    assert "".join(ch.choices[0].delta.content for ch in chunks) == whole.message.content
    streamed = [x.model_dump() for ch in chunks[1:] for x in ch.choices[0].logprobs.content]
    assert streamed == [x.model_dump() for x in whole.logprobs.content] and len(streamed) == 8
    assert [ch.choices[0].finish_reason for ch in chunks] == [None] * (len(chunks) - 1) + [whole.finish_reason]


@pytest.mark.slow
def test_streamed_stop_string_matches_non_streamed(bf16_url):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    greedy = httpx.post(bf16_url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]
    stop = greedy[len(greedy) // 3 : len(greedy) // 3 + 6]  # most likely spans two tokens
    cut = httpx.post(bf16_url + "/v1/completions", json={**body, "stop": stop}, timeout=120).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == greedy[: greedy.find(stop)]
    texts = [chunk["choices"][0]["text"] for chunk in _sse(bf16_url, "/v1/completions", {**body, "stop": stop,
                                                                                               "stream": True})]
    assert "".join(texts) == cut["text"] and not any(stop in t for t in texts)


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [{"stream": "yes"}, {"stream_options": {"include_usage": True}}, {"stream": True, "stream_options": []}],
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_bad_stream_requests_get_400(bf16_url, path, extra):
    body = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    r = httpx.post(bf16_url + path, json={**body, "max_tokens": 2, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] in ("stream", "stream_options")


@pytest.mark.slow
def test_client_that_hangs_up_leaves_the_engine_working(bf16_url):
    before = _metric(bf16_url, "generation_tokens_total")
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", bf16_url + "/v1/completions", json=body, timeout=120) as r:
        assert next(r.iter_lines()).startswith("data: {")  # one event, then hang up
    after = httpx.post(bf16_url + "/v1/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=120)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 2
    deadline = time.monotonic() + 60
    while _metric(bf16_url, "generation_tokens_total") < before + 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(bf16_url, "generation_tokens_total") == before + 10  # the abandoned request still ran its 8 tokens
