import json
import random

import httpx
import openai
import pytest

from kvqual import client
from kvqual.client import (backoff_delay, chat_payload, classify, completion_payload, echo_payload, parse_chat,
                           parse_completion, parse_echo, token_id_of)
from kvqual.errors import ServerContractError, register_secret
from kvqual.records import GenerationParams, Item

PARAMS = GenerationParams(temperature=0.0, seed=7, max_tokens=64, top_logprobs=3)


def test_completion_payload_exact():
    item = Item(id="a", suite="s", prompt="Hi", max_tokens=5)
    assert completion_payload(item, PARAMS, "m", repeat=2) == {
        "model": "m", "prompt": "Hi", "max_tokens": 5, "temperature": 0.0, "top_p": 1.0, "seed": 9, "logprobs": 3}


def test_token_id_prompt_and_chat_payload():
    item = Item(id="a", suite="s", prompt=(1, 2))
    assert completion_payload(item, PARAMS, "m")["prompt"] == [1, 2]
    chat = Item(id="b", suite="s", messages=({"role": "user", "content": "q"},))
    assert chat_payload(chat, PARAMS, "m") == {
        "model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": 64, "temperature": 0.0,
        "top_p": 1.0, "seed": 7, "logprobs": True, "top_logprobs": 3}


def test_echo_payload():
    # a token-id prompt asks for ids back, so what was scored can be checked against what was sent
    assert echo_payload([5, 6], "m", 5) == {"model": "m", "prompt": [5, 6], "max_tokens": 1, "echo": True,
                                            "temperature": 0.0, "logprobs": 5, "return_tokens_as_token_ids": True}
    assert "return_tokens_as_token_ids" not in echo_payload("text", "m", 5)


def test_generation_asks_for_token_ids_only_when_told():
    from kvqual.records import GenerationParams, Item

    item = Item(id="a", suite="s", messages=({"role": "user", "content": "hi"},))
    with_ids = GenerationParams(token_ids=True)
    assert chat_payload(item, with_ids, "m")["return_tokens_as_token_ids"] is True
    assert "return_tokens_as_token_ids" not in chat_payload(item, GenerationParams(), "m")
    text = Item(id="b", suite="s", prompt="hi")
    assert completion_payload(text, with_ids, "m")["return_tokens_as_token_ids"] is True
    # a run from before the field keeps its identity (its manifest's params have no token_ids)
    assert "token_ids" not in GenerationParams().to_json() and with_ids.to_json()["token_ids"] is True


def test_echo_of_token_ids_keeps_the_ids_when_the_generated_token_is_dropped():
    data = {"choices": [{"index": 0, "text": "", "logprobs": {
        "tokens": ["token_id:5", "token_id:6", "token_id:9"], "token_logprobs": [None, -0.5, -0.1],
        "top_logprobs": [None, {"token_id:6": -0.5}, {"token_id:9": -0.1}], "text_offset": [0, 1, 2]}}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1}}
    lp = parse_echo(data)
    assert lp.token_ids == (5, 6) and lp.tokens == ("token_id:5", "token_id:6")


COMPLETION = {
    "choices": [{"index": 0, "text": " 4", "finish_reason": "stop", "logprobs": {
        "tokens": [" 4", "<eos>"], "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{" 4": -0.1, " 5": -2.0}, {"<eos>": -0.2}], "text_offset": [3, 5]}}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}


def test_parse_completion():
    a = parse_completion(COMPLETION, 3)
    assert (a.text, a.finish_reason, a.prompt_tokens, a.completion_tokens) == (" 4", "stop", 3, 2)
    assert a.logprobs.tokens == (" 4", "<eos>") and a.logprobs.top_logprobs[0] == {" 4": -0.1, " 5": -2.0}
    assert a.logprobs.text_offset == (3, 5) and a.logprobs.token_ids is None


def test_missing_logprobs_is_a_contract_error():
    data = {"choices": [{"index": 0, "text": "x", "finish_reason": "stop"}], "usage": {"completion_tokens": 1}}
    with pytest.raises(ServerContractError, match="logprobs were requested"):
        parse_completion(data, 3, "http://h/v1")
    assert parse_completion(data, 0).text == "x"  # not requested: fine


def test_short_logprobs_is_a_contract_error():
    data = {**COMPLETION, "usage": {"completion_tokens": 5}}
    with pytest.raises(ServerContractError, match="usage says 5 completion tokens but logprobs cover 2"):
        parse_completion(data, 3)


def test_vllm_token_ids():
    assert token_id_of("token_id:42") == 42 and token_id_of("hello") is None
    data = {"choices": [{"text": "ab", "finish_reason": "stop", "logprobs": {
        "tokens": ["token_id:1", "token_id:2"], "token_logprobs": [-1.0, -2.0], "top_logprobs": [{}, {}]}}],
        "usage": {"completion_tokens": 2}}
    assert parse_completion(data, 1).logprobs.token_ids == (1, 2)


def test_parse_chat():
    data = {"choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "Hi"},
                         "logprobs": {"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                                                   "top_logprobs": [{"token": "Hi", "logprob": -0.5},
                                                                    {"token": "Yo", "logprob": -1.5}]}]}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 1}}
    a = parse_chat(data, 2)
    assert a.text == "Hi" and a.finish_reason == "length"
    assert a.logprobs.top_logprobs == ({"Hi": -0.5, "Yo": -1.5},)


def test_parse_echo_requires_prompt_logprobs():
    good = {"choices": [{"text": "a b", "logprobs": {"tokens": ["a", " b"], "token_logprobs": [None, -1.0],
                                                      "top_logprobs": [None, {" b": -1.0}]}}],
            "usage": {"prompt_tokens": 2}}
    assert parse_echo(good).token_logprobs == (None, -1.0)
    with pytest.raises(ServerContractError, match="no prompt logprobs"):
        parse_echo({"choices": [{"text": "a b", "logprobs": None}]}, "srv")
    short = {**good, "usage": {"prompt_tokens": 5}}
    with pytest.raises(ServerContractError, match="2 logprobs for 5 prompt tokens"):
        parse_echo(short)
    # max_tokens=1: the token generated after the prompt is dropped by the usage count
    plus = {"choices": [{"text": "a b c", "logprobs": {"tokens": ["a", " b", " c"], "token_logprobs": [None, -1.0, -2.0],
                                                        "top_logprobs": [None, {" b": -1.0}, {" c": -2.0}],
                                                        "text_offset": [0, 1, 3]}}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1}}
    lp = parse_echo(plus)
    assert lp.tokens == ("a", " b") and lp.text_offset == (0, 1) and len(lp.top_logprobs) == 2


def _status_error(status: int, headers: dict | None = None) -> openai.APIStatusError:
    req = httpx.Request("POST", "http://h/v1/completions")
    resp = httpx.Response(status, headers=headers or {}, text="boom", request=req)
    return openai.APIStatusError("x", response=resp, body=None)


@pytest.mark.parametrize("status, transient", [(400, False), (401, False), (404, False), (408, True),
                                               (429, True), (500, True), (503, True)])
def test_classify_status(status, transient):
    assert classify(_status_error(status)).transient is transient


def test_classify_retry_after_and_connection():
    assert classify(_status_error(429, {"Retry-After": "3"})).retry_after == 3.0
    req = httpx.Request("POST", "http://h")
    assert classify(openai.APIConnectionError(request=req)).transient
    assert classify(openai.APITimeoutError(request=req)).message == "timeout"
    assert not classify(RuntimeError("x")).transient


def test_backoff_grows_and_honours_retry_after():
    rng = random.Random(0)
    assert all(0 <= backoff_delay(0, rng) <= 0.5 for _ in range(50))
    assert max(backoff_delay(6, rng) for _ in range(200)) > 5
    assert all(backoff_delay(10, rng) <= 30 for _ in range(50))
    assert backoff_delay(0, rng, retry_after=2.0) >= 2.0


# ---------------------------------------------------------------- streams

def _cmpl_chunk(text, tokens=None, finish=None, offsets=None):
    lp = None if tokens is None else {"tokens": tokens, "token_logprobs": [-0.5] * len(tokens),
                                      "top_logprobs": [{t: -0.5} for t in tokens], "text_offset": offsets}
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}]}


def test_completion_stream_adds_up_to_the_plain_response():
    chunks = [_cmpl_chunk(" a", [" a"], offsets=[5]), _cmpl_chunk(" b", [" b"], offsets=[7]),
              _cmpl_chunk("", [], finish="length", offsets=[]),
              {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}]
    merged = client.merge_completion_stream(chunks)
    answer = client.parse_completion(merged, want_logprobs=1)
    assert (answer.text, answer.finish_reason, answer.prompt_tokens, answer.completion_tokens) == (" a b", "length", 3, 2)
    assert answer.logprobs.tokens == (" a", " b") and answer.logprobs.text_offset == (5, 7)
    assert answer.logprobs.top_logprobs == ({" a": -0.5}, {" b": -0.5})


def test_completion_stream_without_usage_or_offsets():
    merged = client.merge_completion_stream([_cmpl_chunk("x", ["x"]), _cmpl_chunk("y", ["y"], finish="stop")])
    assert merged["usage"] is None and "text_offset" not in merged["choices"][0]["logprobs"]
    answer = client.parse_completion(merged, want_logprobs=1)
    assert answer.text == "xy" and answer.completion_tokens is None and answer.logprobs.text_offset is None


def test_stream_that_drops_logprobs_is_a_contract_error():
    merged = client.merge_completion_stream([_cmpl_chunk("x"), _cmpl_chunk("y", finish="stop")])
    with pytest.raises(ServerContractError):
        client.parse_completion(merged, want_logprobs=2)


def test_chat_stream_adds_up_to_the_plain_response():
    def piece(tok):
        return {"token": tok, "logprob": -0.1, "bytes": list(tok.encode()), "top_logprobs": [{"token": tok, "logprob": -0.1}]}

    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": [piece("Hi")]}}]},
              {"choices": [{"index": 0, "delta": {"content": " you"}, "logprobs": {"content": [piece(" you")]},
                            "finish_reason": "stop"}]},
              {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}]
    assert not client.chunk_has_content(chunks[0], chat=True) and client.chunk_has_content(chunks[1], chat=True)
    answer = client.parse_chat(client.merge_chat_stream(chunks), want_logprobs=1)
    assert (answer.text, answer.finish_reason, answer.completion_tokens) == ("Hi you", "stop", 2)
    assert answer.logprobs.tokens == ("Hi", " you") and answer.logprobs.top_logprobs[1] == {" you": -0.1}


def test_inter_token_latency_is_vllm_tpot():
    assert client.inter_token_latency(0.5, 2.5, 5) == pytest.approx(0.5)  # 4 gaps over 2 s
    assert client.inter_token_latency(0.5, 0.5, 1) is None  # one token: no gap to measure
    assert client.inter_token_latency(None, 2.0, 5) is None


def test_stream_payload_asks_for_usage():
    assert client.stream_payload({"model": "m"}) == {"model": "m", "stream": True,
                                                      "stream_options": {"include_usage": True}}


# ---------------------------------------------------------------- secrets

def test_a_key_in_an_error_body_is_redacted_before_the_body_is_cut():
    secret = "sk-kvqual-cut-" + "7" * 24
    register_secret(secret)
    req = httpx.Request("POST", "http://h/v1/completions")
    text = "x" * 280 + f" Bearer {secret} tail"  # a plain 300-character cut would keep the key's first 12 characters
    info = classify(openai.APIStatusError("x", response=httpx.Response(400, text=text, request=req), body=None))
    assert "sk-kvqual" not in info.message and info.message.endswith("Bearer *** tail")
    assert secret not in classify(RuntimeError(f"oops {secret}")).message
    register_secret("EMPTY")  # a placeholder is not a secret: text keeps the word
    assert "EMPTY" in classify(RuntimeError("Bearer EMPTY")).message


def test_no_file_under_results_holds_the_api_key_a_server_echoes(tmp_path, fake_server):
    import os
    import subprocess
    import sys

    from kvtest import write_suite

    secret, openai_secret = "sk-kvqual-e2e-SECRET-0123456789", "sk-openai-user-SECRET-9876543210"
    server = fake_server("--echo-auth")
    write_suite(tmp_path / "s.jsonl", [{"id": "bad", "prompt": "badrequest"}, {"id": "down", "prompt": "broken"},
                                       {"id": "fine", "prompt": "hello"}])
    (tmp_path / "kvqual.toml").write_text(
        f'[run]\nretries = 0\nmax_failed_rate = 1.0\n'
        f'[targets.keyed]\nbase_url = "{server.base_url}"\napi_key_env = "KVQUAL_TEST_KEY"\n'
        f'[targets.plain]\nbase_url = "{server.base_url}"\n')
    env = {**os.environ, "CI": "true", "KVQUAL_TEST_KEY": secret, "OPENAI_API_KEY": openai_secret}
    errors = {}
    for target in ("keyed", "plain"):
        r = subprocess.run([sys.executable, "-m", "kvqual", "run", target, "--suite", "s.jsonl"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 4 and secret not in r.stdout + r.stderr, r.stderr  # 4: requests failed for good
        samples = [json.loads(l) for l in next((tmp_path / "results").glob(f"{target}-*/samples.jsonl")).open()]
        errors[target] = {s["id"]: s["error"] for s in samples}
    # the server did echo the header into both error bodies (400 and 500) ...
    assert "(Authorization: Bearer ***)" in errors["keyed"]["bad"] and "Bearer ***" in errors["keyed"]["down"]
    assert errors["keyed"]["fine"] is None
    # ... a target without api_key_env on a non-OpenAI URL never got the user's OPENAI_API_KEY ...
    assert "(Authorization: Bearer EMPTY)" in errors["plain"]["bad"]
    # ... and no file kvqual wrote holds either key
    files = [p for p in (tmp_path / "results").rglob("*") if p.is_file()]
    assert files and not [p for p in files if secret.encode() in p.read_bytes() or openai_secret.encode() in p.read_bytes()]
