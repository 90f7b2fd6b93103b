import contextlib
import json
import random

import httpx
import openai
import pytest

from kvqual import bodies, client, transport as transport_module
from kvqual.client import (chat_payload, completion_payload, echo_payload, parse_chat, parse_completion, parse_echo,
                           token_id_of)
from kvqual.retry import backoff_delay, classify
from kvqual.errors import InvalidResponse, ServerContractError, register_secret
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


@pytest.mark.parametrize("tokens, ids", [
    (["token_id:1", "token_id:2"], (1, 2)), (["token_id:007", "token_id:0"], (7, 0)),  # as token_id_of reads them
    (["a", "token_id:2"], None), (["token_id:1", "b"], None), (["token_id:1\ttoken_id:2", "token_id:3"], None),
    (["token_id:\u0661", "token_id:2"], (1, 2)),  # a digit isdigit() takes: the token-by-token path
])
def test_token_ids_are_read_as_token_id_of_reads_each_token(tokens, ids):
    data = {"choices": [{"text": "x", "logprobs": {"tokens": tokens, "token_logprobs": [-1.0] * len(tokens),
                                                     "top_logprobs": [{"a": -1.0}, None]}}]}
    lp = parse_completion(data, 1).logprobs
    expected = [token_id_of(t) for t in tokens]
    assert lp.token_ids == ids == (tuple(expected) if None not in expected else None)
    assert lp.top_logprobs == ({"a": -1.0}, {})  # a null top-k entry is an empty map, as before


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


# ---------------------------------------------------------------- garbage is not data


def _answer(model="m", lp=-0.5, top=-0.5):
    return {"model": model, "choices": [{"index": 0, "text": " x", "finish_reason": "stop", "logprobs": {
        "tokens": [" x"], "token_logprobs": [lp], "top_logprobs": [{" x": top}], "text_offset": [0]}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1}}


@pytest.mark.parametrize("lp, top", [(float("nan"), -0.5), (float("-inf"), -0.5), (-0.5, float("inf")),
                                     (None, -0.5), ("-0.5", -0.5), (True, -0.5)])
def test_a_non_finite_or_missing_logprob_is_an_invalid_response(lp, top):
    with pytest.raises(InvalidResponse, match="not a finite number"):
        parse_completion(_answer(lp=lp, top=top), 1, "http://h/v1")
    with pytest.raises(InvalidResponse):  # logprobs not asked for, but garbage all the same
        parse_completion(_answer(lp=lp, top=top), 0)


def test_vllms_clamped_minus_infinity_is_a_number():
    assert parse_completion(_answer(lp=-9999.0, top=-9999.0), 1).logprobs.token_logprobs == (-9999.0,)


def test_chat_and_streamed_nan_logprobs_are_invalid_too():
    content = [{"token": "Hi", "logprob": float("nan"), "top_logprobs": [{"token": "Hi", "logprob": -0.1}]}]
    data = {"choices": [{"message": {"content": "Hi"}, "finish_reason": "stop", "logprobs": {"content": content}}],
            "usage": {"completion_tokens": 1}}
    with pytest.raises(InvalidResponse, match="logprob of token 0 is nan"):
        parse_chat(data, 1)
    chunk = _cmpl_chunk(" a", [" a"], finish="stop")
    chunk["choices"][0]["logprobs"]["token_logprobs"] = [float("nan")]  # the SDK's SSE decoder lets NaN through
    with pytest.raises(InvalidResponse):
        parse_completion(client.merge_completion_stream([chunk]), 1)


def test_echo_allows_null_logprobs_but_not_nan():
    data = {"choices": [{"text": "a b", "logprobs": {"tokens": ["a", " b"], "token_logprobs": [None, float("nan")],
                                                      "top_logprobs": [None, {" b": -1.0}]}}],
            "usage": {"prompt_tokens": 2}}
    with pytest.raises(InvalidResponse):
        parse_echo(data)


def test_the_bulk_finite_check_passes_and_names_what_the_one_by_one_check_does():
    from kvqual.records import TokenLogprobs

    def lp(values, tops=None):
        return TokenLogprobs(tokens=("a",) * len(values), token_logprobs=tuple(values),
                             top_logprobs=tuple(tops if tops is not None else ({"a": v} for v in values)))

    class Float(float):
        pass

    client.check_finite(lp([1e308] * 4), "s")  # finite, though their sum overflows
    client.check_finite(lp([-1, Float(-0.5), -9999.0]), "s")  # an int, a float subclass: numbers
    client.check_finite(lp([None, -0.5], [{}, {"a": None, "b": -1.0}]), "s", nulls=True)
    tops = [{"a": -0.5, "b": -1.5}] * 300
    tops[217] = {"a": -0.5, "b": float("-inf")}
    with pytest.raises(InvalidResponse, match="^s: a top logprob of token 217 is -inf, not a finite number$"):
        client.check_finite(lp([-0.5] * 300, tops), "s")
    for bad, shown in ((float("inf"), "inf"), (float("nan"), "nan"), (False, "False"), (None, "None"), ("-1", "'-1'")):
        with pytest.raises(InvalidResponse, match=f"^s: logprob of token 2 is {shown}, not a finite number$"):
            client.check_finite(lp([-0.5, -0.5, bad, -0.5]), "s")
    with pytest.raises(InvalidResponse, match="token 1 is inf"):  # inf and -inf: a NaN sum; the loop names the first
        client.check_finite(lp([-0.5, float("inf"), float("-inf")]), "s")
    with pytest.raises(OverflowError):  # an int too big for a float fails as it always did
        client.check_finite(lp([-0.5, 10**400]), "s")


def test_decode_json_refuses_what_json_does_not_have():
    assert bodies.decode_json(b'{"a": -0.5, "b": [1, 2e3]}') == {"a": -0.5, "b": [1, 2000.0]}
    for body in (b'{"a": NaN}', b'{"a": -Infinity}', b'{"a": 1e999}', b"not json", b"\xff\xfe"):
        with pytest.raises(InvalidResponse, match="malformed response"):
            bodies.decode_json(body, "http://h/v1")


def test_decode_json_accepts_and_refuses_what_the_standard_decoder_with_its_hooks_does():
    """orjson decodes first; what it refuses gets the standard decoder's verdict and message."""
    import json

    for body, message in ((b'{"a": NaN}', "NaN is not a JSON number"), (b'[-Infinity]', "-Infinity is not a JSON number"),
                          (b'{"a": -1e999}', "-1e999 overflows to infinity"), (b'[1.5e400]', "1.5e400 overflows")):
        with pytest.raises(InvalidResponse, match=f"^http://h/v1: malformed response: {message}"):
            bodies.decode_json(body, "http://h/v1")
    big = b"[" + b"1" * 400 + b"]"  # an integer no double holds: JSON, so decoded, then refused as a logprob
    assert bodies.decode_json(big) == json.loads(big)
    assert bodies.decode_json('{"a": "\\ud800"}'.encode()) == {"a": "\ud800"}  # a lone surrogate escape
    assert bodies.decode_json('{"a": -0.5}'.encode("utf-16")) == {"a": -0.5}  # JSON in UTF-16
    assert bodies.decode_json(b'{"a": 1e308, "b": 5e-324, "c": 18446744073709551616}') == {
        "a": 1e308, "b": 5e-324, "c": 18446744073709551616}


@pytest.mark.parametrize("returned, ok", [("m", True), (None, True), ("", True), ("other", False),
                                          ("m-2024-08-06", True), ("m-0613", True), ("m-large", False),
                                          ("mm", False), (7, False)])
def test_an_answer_must_come_from_the_requested_model(returned, ok):
    data = {"model": returned} if returned is not None else {}
    if ok:
        bodies.check_model("m", data)
    else:
        with pytest.raises(InvalidResponse, match="not the requested 'm'"):
            bodies.check_model("m", data)


def test_invalid_response_is_a_final_failure_not_a_run_stopping_contract_error():
    # the runner re-raises ServerContractError (stops the run, exit 4) and records anything else
    assert not issubclass(InvalidResponse, ServerContractError)
    info = classify(InvalidResponse("http://h/v1: logprob of token 3 is nan, not a finite number"))
    assert not info.transient and info.message == "invalid response: http://h/v1: logprob of token 3 is nan, not a finite number"


@contextlib.asynccontextmanager
async def _serving(app):
    """Serve an aiohttp app on a free local port for the block; yields the port."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - the port the OS picked
    finally:
        await runner.cleanup()


def _garbage_app(cap: int):
    from aiohttp import web

    good = json.dumps(_answer())

    async def completions(request):
        prompt = (await request.json())["prompt"]
        if prompt == "nan":
            return web.Response(text=good.replace("-0.5", "NaN", 1), content_type="application/json")
        if prompt == "overflow":
            return web.Response(text=good.replace("-0.5", "-1e999", 1), content_type="application/json")
        if prompt == "other":
            return web.json_response(_answer(model="someone-else"))
        if prompt == "snapshot":
            return web.json_response(_answer(model="m-2024-08-06"))
        if prompt == "huge":  # declared by Content-Length
            return web.Response(body=b" " * (cap + 1) + good.encode(), content_type="application/json")
        if prompt == "huge-chunked":  # no length declared: cut off while reading
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            for _ in range(4):
                await response.write(b" " * (cap // 2))
            await response.write(good.encode())
            return response
        return web.json_response(_answer())

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.add_routes([web.post("/v1/completions", completions), web.get("/v1/models", models)])
    return app


def test_transport_turns_garbage_into_invalid_responses(monkeypatch):
    import asyncio

    cap = 1 << 20
    monkeypatch.setattr(bodies, "MAX_RESPONSE_BYTES", cap)

    async def main() -> dict[str, str]:
        async with _serving(_garbage_app(cap)) as port:
            transport = transport_module.Transport(f"http://127.0.0.1:{port}/v1", "EMPTY", timeout=10)
            outcome: dict[str, str] = {}
            try:
                for prompt in ("ok", "snapshot", "nan", "overflow", "other", "huge", "huge-chunked", "ok"):
                    try:
                        data = await transport.post_json("/completions", {"model": "m", "prompt": prompt})
                        outcome[prompt] = parse_completion(data, 1).text
                    except Exception as exc:  # noqa: BLE001 - what the runner records
                        info = classify(exc)
                        assert not info.transient, info
                        outcome[prompt] = info.message
            finally:
                await transport.aclose()
        return outcome

    out = asyncio.run(main())
    assert out["ok"] == " x" and out["snapshot"] == " x"
    assert "malformed response" in out["nan"] and "NaN is not a JSON number" in out["nan"]
    assert "overflows to infinity" in out["overflow"]
    assert "answered by model 'someone-else', not the requested 'm'" in out["other"]
    assert "over 1 MiB (MAX_RESPONSE_BYTES)" in out["huge"] and "over 1 MiB" in out["huge-chunked"]
    assert all(v.startswith("invalid response: ") for k, v in out.items() if k not in ("ok", "snapshot"))


def test_a_run_records_garbage_as_failed_requests_and_keeps_going(tmp_path):
    """End to end: `kvqual run` against a server that sends NaN, another model's answer and good ones."""
    import asyncio
    import os
    import subprocess
    import sys
    import threading

    from aiohttp import web

    from kvtest import write_suite

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_garbage_app(bodies.MAX_RESPONSE_BYTES))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        write_suite(tmp_path / "s.jsonl", [{"id": p, "prompt": p} for p in ("ok", "nan", "overflow", "other")]
                    + [{"id": f"ok{i}", "prompt": f"fine {i}"} for i in range(4)])
        (tmp_path / "kvqual.toml").write_text(f'[run]\nmax_failed_rate = 1.0\nretries = 0\n[targets.g]\n'
                                              f'base_url = "http://127.0.0.1:{port}/v1"\nmodel = "m"\n')
        r = subprocess.run([sys.executable, "-m", "kvqual", "run", "g", "--suite", "s.jsonl"], cwd=tmp_path,
                           env={**os.environ, "CI": "true"}, capture_output=True, text=True, timeout=120)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
    assert r.returncode == 4 and "Traceback" not in r.stderr, r.stderr  # 4: a run with requests failed for good
    samples = {s["id"]: s for s in map(json.loads, next((tmp_path / "results").glob("g-*/samples.jsonl")).open())}
    assert len(samples) == 8
    for garbage in ("nan", "overflow", "other"):
        assert samples[garbage]["text"] is None and samples[garbage]["error"].startswith("invalid response: ")
    assert all(samples[k]["error"] is None and samples[k]["text"] == " x" for k in ("ok", "ok0", "ok3"))
    manifest = json.loads(next((tmp_path / "results").glob("g-*/manifest.json")).read_text())
    assert manifest["counts"]["failed"] == 3 and manifest["counts"]["ok"] == 5


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


def test_only_a_plain_http_target_skips_the_ca_bundle():
    import asyncio
    import ssl

    async def context_of(url: str) -> ssl.SSLContext:
        transport = transport_module.Transport(url, "", timeout=5)
        try:
            return transport._client._client._transport.ssl_context  # noqa: SLF001 - the SDK's aiohttp transport
        finally:
            await transport.aclose()

    https = asyncio.run(context_of("https://example.invalid/v1"))
    assert https.verify_mode == ssl.CERT_REQUIRED and https.check_hostname  # TLS targets are verified as ever
    assert asyncio.run(context_of("HTTP://127.0.0.1:9/v1")).verify_mode == ssl.CERT_NONE  # never used: no TLS


def test_a_reset_under_the_sdks_timeout_is_called_a_connection_error():
    """openai's aiohttp transport raises APITimeoutError for every aiohttp connection error; the
    stored reason names what happened (still retried)."""
    import aiohttp

    request = httpx.Request("POST", "http://x/v1/completions")
    try:
        try:
            raise aiohttp.ClientOSError(104, "Connection reset by peer")
        except aiohttp.ClientOSError as root:
            raise openai.APITimeoutError(request=request) from root
    except openai.APITimeoutError as exc:
        reset = classify(exc)
    assert reset.transient and reset.message.startswith("connection error: ClientOSError")
    try:
        try:
            raise aiohttp.ServerTimeoutError("read timed out")
        except aiohttp.ServerTimeoutError as root:
            raise openai.APITimeoutError(request=request) from root
    except openai.APITimeoutError as exc:
        slow = classify(exc)
    assert slow.transient and slow.message == "timeout"


def test_streamed_token_ids_add_up_to_the_generated_ids():
    """SGLang's (and vLLM's) `return_token_ids`, streamed: each chunk's token_ids are its new tokens;
    merged, the answer's logprobs carry every id (what exact teacher forcing needs)."""
    from kvqual.client import merge_chat_stream, merge_completion_stream

    def entry(t):
        return {"token": t, "logprob": -0.1, "top_logprobs": [{"token": t, "logprob": -0.1}]}

    chat = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}]},
            {"choices": [{"index": 0, "delta": {"content": "He"}, "token_ids": [17],
                          "logprobs": {"content": [entry("He")]}}]},
            {"choices": [{"index": 0, "delta": {"content": "llo"}, "token_ids": [42], "finish_reason": "stop",
                          "logprobs": {"content": [entry("llo")]}}]},
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}]
    answer = parse_chat(merge_chat_stream(chat), 1)
    assert answer.text == "Hello" and answer.logprobs.token_ids == (17, 42) and answer.logprobs.tokens == ("He", "llo")
    text = [{"choices": [{"index": 0, "text": " 4", "token_ids": [9],
                          "logprobs": {"tokens": [" 4"], "token_logprobs": [-0.1], "top_logprobs": [{" 4": -0.1}]}}]},
            {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}]
    assert parse_completion(merge_completion_stream(text), 1).logprobs.token_ids == (9,)


def _behaviours_app(seen: list):
    """A server with one path per way a POST can end: an answer (plain, gzipped, after a redirect),
    an error status (with Retry-After), a redirect loop, a body cut short, a connection closed
    before any response, a response too slow to come."""
    import asyncio
    import gzip

    from aiohttp import web

    answer = {"model": "m", "choices": [{"text": " x", "finish_reason": "stop"}]}

    async def handle(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        seen.append((name, {k: v for k, v in request.headers.items()}, await request.read()))
        if name == "ok":
            return web.json_response(answer)
        if name == "gzip":
            return web.Response(body=gzip.compress(json.dumps(answer).encode()),
                                headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
        if name == "redirect":
            raise web.HTTPTemporaryRedirect("/v1/ok")
        if name == "loop":
            raise web.HTTPTemporaryRedirect("/v1/loop")
        if name == "e500":
            return web.Response(status=500, text="boom " * 100, headers={"Retry-After": "2"})
        if name == "e400":
            return web.json_response({"error": {"message": "bad prompt"}}, status=400)
        if name == "e301":
            return web.Response(status=301, text="moved")  # no Location: not followed
        if name == "cut":
            response = web.StreamResponse(headers={"Content-Length": "100000", "Content-Type": "application/json"})
            await response.prepare(request)
            await response.write(b'{"model": "m", "choices": [')
            request.transport.close()
            return response
        if name == "close":
            request.transport.close()
            return web.Response()
        if name == "slow":
            await asyncio.sleep(3)
            return web.json_response(answer)
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_post("/v1/{name}", handle)
    return app


def test_the_direct_post_sends_and_fails_as_the_sdk_does():
    """`Transport.post_json` skips the SDK's request building on a plain-http target: the same
    request goes out (headers, auth, body bytes), and every way it can end gives the same answer or
    the same failure as the SDK's own POST: `classify`'s message, retry class and Retry-After, and
    `retry.closed_before_response`. Only a redirect loop is told in other words (aiohttp's and
    httpx's), in the same retry class."""
    import asyncio
    import socket

    from kvqual.retry import closed_before_response

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        refused = s.getsockname()[1]

    async def outcomes(direct: bool, seen: list) -> dict[str, tuple]:
        async with _serving(_behaviours_app(seen)) as port:
            transport = transport_module.Transport(f"http://127.0.0.1:{port}/v1", "sekret-direct-test", timeout=1.0)
            assert transport._direct  # noqa: SLF001 - a plain-http target takes the direct POST
            transport._direct = direct  # noqa: SLF001 - the SDK's path, for the side by side
            out: dict[str, tuple] = {}
            try:
                for name in ("ok", "gzip", "redirect", "e500", "e400", "e301", "cut", "close", "slow", "loop", "ok"):
                    try:
                        out[name] = ("answer", await transport.post_json(f"/{name}", {"model": "m", "prompt": "p"}))
                    except Exception as exc:  # noqa: BLE001 - what the runner records
                        info = classify(exc)
                        out[name] = ("failed", info.message, info.transient, info.retry_after, closed_before_response(exc))
                other = transport_module.Transport(f"http://127.0.0.1:{refused}/v1", "", timeout=1.0)
                other._direct = direct  # noqa: SLF001
                try:
                    await other.post_json("/ok", {"model": "m"})
                except Exception as exc:  # noqa: BLE001
                    info = classify(exc)
                    out["refused"] = ("failed", info.message, info.transient, info.retry_after, closed_before_response(exc))
                finally:
                    await other.aclose()
            finally:
                await transport.aclose()
        return out

    seen_sdk: list = []
    seen_direct: list = []
    sdk = asyncio.run(outcomes(False, seen_sdk))
    direct = asyncio.run(outcomes(True, seen_direct))
    assert sdk["ok"][0] == sdk["gzip"][0] == sdk["redirect"][0] == "answer"
    assert sdk["e500"][1].startswith("HTTP 500: boom") and sdk["e500"][2:4] == (True, 2.0)
    assert sdk["e400"][1].startswith("HTTP 400: ") and sdk["e400"][2] is False
    assert sdk["slow"][1] == "timeout" and sdk["close"][4] is True and sdk["refused"][1].startswith("connection error")
    loop_sdk, loop_direct = sdk.pop("loop"), direct.pop("loop")
    assert loop_sdk[0] == loop_direct[0] == "failed" and loop_sdk[2] == loop_direct[2]
    assert direct == sdk
    # the same requests: every header (auth, the SDK's own, Accept-Encoding) and the same body bytes
    def sent(seen: list) -> list:  # header names are case-insensitive; Host names the port of each run's server
        return [(n, {k.lower(): v for k, v in h.items() if k.lower() != "host"}, b) for n, h, b in seen if n != "loop"]

    assert sent(seen_direct) == sent(seen_sdk)
    assert seen_direct[0][1]["Authorization"] == "Bearer sekret-direct-test"


def test_the_sdk_path_is_kept_where_the_direct_post_would_differ(monkeypatch):
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    assert transport_module.Transport("http://127.0.0.1:9/v1", "", 5)._direct  # noqa: SLF001
    assert not transport_module.Transport("https://example.invalid/v1", "", 5)._direct  # noqa: SLF001 - TLS: the SDK's
    assert not transport_module.Transport("http://127.0.0.1:9/v1?x=1", "", 5)._direct  # noqa: SLF001
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert not transport_module.Transport("http://127.0.0.1:9/v1", "", 5)._direct  # noqa: SLF001 - the SDK honours proxies
