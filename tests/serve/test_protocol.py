"""Request validation and response shaping, asserted on exact values."""

import pytest

from kvqual.serve.engine import Generation
from kvqual.serve.protocol import (
    ApiError,
    TokenText,
    completion_logprobs,
    completion_response,
    parse_chat,
    parse_completion,
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
