"""Request validation and response shaping, asserted on exact values."""

import pytest

from kvqual.serve.engine import Generation
from kvqual.serve.protocol import (
    SSE_DONE,
    ApiError,
    DeltaText,
    StreamChunker,
    TokenText,
    chat_response,
    completion_logprobs,
    completion_response,
    parse_chat,
    parse_completion,
    releasable_text,
    sse_event,
)
from kvqual.serve.sampling import TokenLogprob

MODEL = "m"


@pytest.mark.parametrize(
    "body, param, status",
    [
        ({"model": "other", "prompt": "x"}, "model", 404),
        ({"prompt": "x", "logprobs": 21}, "logprobs", 400),
        ({"prompt": "x", "max_tokens": -1}, "max_tokens", 400),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens", 400),
        ({"prompt": 3}, "prompt", 400),
        ({"prompt": "x", "stop": 5}, "stop", 400),
        ({"prompt": "x", "temperature": "hot"}, "temperature", 400),
        ({"max_tokens": 3}, "prompt", 400),
    ],
)
def test_bad_completion_requests(body, param, status):
    with pytest.raises(ApiError) as info:
        parse_completion(body, MODEL)
    assert info.value.param == param and info.value.status == status
    assert info.value.body()["error"]["type"] == "invalid_request_error"


def test_completion_prompt_forms():
    assert parse_completion({"prompt": "a"}, MODEL).prompts == ("a",)
    assert parse_completion({"prompt": [1, 2]}, MODEL).prompts == ((1, 2),)
    req = parse_completion({"prompt": ["a", [3]], "max_tokens": 0, "echo": True, "logprobs": 5, "stop": "x"}, MODEL)
    assert req.prompts == ("a", (3,))
    assert (req.params.max_tokens, req.params.echo, req.params.logprobs, req.params.stop) == (0, True, 5, ("x",))


def test_chat_logprobs_need_flag():
    with pytest.raises(ApiError):
        parse_chat({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}, MODEL, 100)
    req = parse_chat({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2}, MODEL, 100)
    assert req.params.logprobs == 2 and req.params.max_tokens == 100


def test_echo_logprobs_block_exact():
    pieces = ["A", " b", "c"]
    entries = [None, TokenLogprob(1, -0.5, ((1, -0.5), (2, -1.0))), TokenLogprob(2, -1.5, ((1, -0.1),))]
    block = completion_logprobs(entries, [0, 1, 2], TokenText(pieces, False), 0)
    assert block == {
        "tokens": ["A", " b", "c"],
        "token_logprobs": [None, -0.5, -1.5],
        "top_logprobs": [None, {" b": -0.5, "c": -1.0}, {" b": -0.1}],
        "text_offset": [0, 1, 3],
    }
    as_ids = completion_logprobs(entries[1:], [1, 2], TokenText(pieces, True), 0)
    assert as_ids["tokens"] == ["token_id:1", "token_id:2"]


def test_completion_response_echo_and_usage():
    req = parse_completion({"prompt": "A", "max_tokens": 1, "echo": True, "logprobs": 0}, MODEL)
    gen = Generation((0,), (1,), " b", "length", (None,), (TokenLogprob(1, -0.5, ()),))
    out = completion_response(req, ["A"], [gen], MODEL, ["A", " b"])
    choice = out["choices"][0]
    assert choice["text"] == "A b" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["token_logprobs"] == [None, -0.5]
    assert out["usage"] == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


# ---- streaming ------------------------------------------------------------------------

CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "stream": 1}, "stream"),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "x", "stream": True, "stream_options": True}, "stream_options"),
        ({"prompt": "x", "stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options"),
        ({"prompt": "x", "stream": True, "echo": True}, "echo"),
        ({"prompt": ["x", "y"], "stream": True}, "prompt"),
    ],
)
def test_bad_stream_requests(body, param):
    with pytest.raises(ApiError) as info:
        parse_completion(body, MODEL)
    assert info.value.param == param and info.value.status == 400
    if param in ("stream", "stream_options"):
        with pytest.raises(ApiError) as info:
            parse_chat({**{k: v for k, v in body.items() if k != "prompt"}, "messages": CHAT}, MODEL, 10)
        assert info.value.param == param


def test_stream_flags():
    req = parse_completion({"prompt": ["x"], "stream": True, "stream_options": {"include_usage": True}}, MODEL)
    assert (req.stream, req.include_usage) == (True, True)
    assert (parse_completion({"prompt": "x", "stream": False}, MODEL).stream, req.prompts) == (False, ("x",))
    chat = parse_chat({"messages": CHAT, "stream": True, "stream_options": {}}, MODEL, 10)
    assert (chat.stream, chat.include_usage) == (True, False)


@pytest.mark.parametrize(
    "text, stops, safe",
    [
        ("Hello wor", ("world",), "Hello "),
        ("Hello world and more", ("world",), "Hello "),
        ("Hello w", ("xyz", "wide"), "Hello "),
        ("Hello", ("o!", "lo!"), "Hel"),
        ("caf\ufffd", (), "caf"),
        ("abc", ("",), "abc"),
        ("ab", ("b", "abc"), "a"),
    ],
)
def test_releasable_text(text, stops, safe):
    assert releasable_text(text, stops) == safe


def test_sse_framing():
    assert sse_event({"a": "é"}) == 'data: {"a": "é"}\n\n' and SSE_DONE == "data: [DONE]\n\n"


# A byte-level toy tokenizer: token 2 and 3 are the two bytes of "é"; token 9 is EOS (no text).
BYTES = [b"Hel", b"lo", b"\xc3", b"\xa9", b" wo", b"rld", b"!", b" ", b"x", b""]
PIECES = [b.decode("utf-8", errors="replace") for b in BYTES]


def _decode(ids):
    return b"".join(BYTES[i] for i in ids).decode("utf-8", errors="replace")


def _generation(ids, text, finish, k=1):
    entries = tuple(TokenLogprob(t, -0.1 * (i + 1), ((t, -0.1 * (i + 1)), (8, -5.0))[:k]) for i, t in enumerate(ids))
    return Generation((5, 6), tuple(ids), text, finish, None, entries)


def _run(chunker, gen):
    chunks = chunker.start()
    for i, (t, e) in enumerate(zip(gen.output_ids, gen.output_logprobs)):
        last = i == len(gen.output_ids) - 1
        chunks += chunker.token(t, e if chunker.want_logprobs else None, gen.finish_reason if last else None)
    return chunks + chunker.done(gen)


@pytest.mark.parametrize("as_ids", [False, True])
@pytest.mark.parametrize(
    "ids, text, finish, stop",
    [
        ([0, 1, 7, 2, 3, 6, 9], "Hello é!", "stop", ()),  # EOS ends it
        ([0, 1, 4, 5], "Hello ", "stop", ("world",)),  # the stop string spans tokens
        ([0, 1, 7, 2, 3], "Hello é", "length", ("é!",)),  # a stop prefix held back, then released at the end
    ],
)
def test_streamed_completion_adds_up_to_the_response(ids, text, finish, stop, as_ids):
    body = {"prompt": "p", "max_tokens": len(ids), "logprobs": 1, "stop": list(stop),
            "return_tokens_as_token_ids": as_ids}
    gen = _generation(ids, text, finish)
    whole = completion_response(parse_completion(body, MODEL), ["p"], [gen], MODEL, PIECES)["choices"][0]
    req = parse_completion({**body, "stream": True}, MODEL)
    chunks = _run(StreamChunker(req, MODEL, PIECES, _decode), gen)
    choices = [c["choices"][0] for c in chunks]
    assert len(choices) == len(ids) and all("usage" not in c for c in chunks)
    assert "".join(c["text"] for c in choices) == whole["text"]
    assert all(all(s not in c["text"] for s in stop) and "\ufffd" not in c["text"] for c in choices)
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        assert [x for c in choices for x in c["logprobs"][key]] == whole["logprobs"][key]
    assert [c["finish_reason"] for c in choices] == [None] * (len(ids) - 1) + [finish]
    assert {c["object"] for c in chunks} == {"text_completion"} and len({c["id"] for c in chunks}) == 1


def test_streamed_completion_without_logprobs_folds_held_tokens_and_adds_usage():
    gen = _generation([0, 1, 2, 3, 7, 8], "Helloé x", "length")
    req = parse_completion({"prompt": "p", "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}},
                           MODEL)
    chunks = _run(StreamChunker(req, MODEL, PIECES, _decode), gen)
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["Hel", "lo", "é", " ", "x"]  # "\xc3" waits
    assert all(c["usage"] is None and c["choices"][0]["logprobs"] is None for c in chunks[:-1])
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 6,
                                                                   "total_tokens": 8}


def test_streamed_chat_adds_up_to_the_response():
    gen = _generation([0, 1, 4, 5], "Hello ", "stop")
    body = {"messages": CHAT, "logprobs": True, "top_logprobs": 2, "stop": "world"}
    whole = chat_response(parse_chat(body, MODEL, 10), gen, MODEL, PIECES)["choices"][0]
    req = parse_chat({**body, "stream": True}, MODEL, 10)
    chunks = _run(StreamChunker(req, MODEL, PIECES, _decode), gen)
    first, rest = chunks[0]["choices"][0], [c["choices"][0] for c in chunks[1:]]
    assert first == {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    assert "".join(c["delta"]["content"] for c in rest) == whole["message"]["content"] == "Hello "
    assert [x for c in rest for x in c["logprobs"]["content"]] == whole["logprobs"]["content"]
    assert rest[-1]["finish_reason"] == "stop" and {c["object"] for c in chunks} == {"chat.completion.chunk"}


def test_delta_text_refuses_a_final_text_it_did_not_prefix():
    text = DeltaText(_decode, ())
    assert text.push(0) == "Hel" and text.push(1) == "lo"
    with pytest.raises(ValueError):
        text.finish("Help")
