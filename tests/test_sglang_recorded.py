"""What a real SGLang answered (0.5.17 on an H100, SmolLM2-135M exported by `kvqual serve --export-hf`,
recorded by scripts/gpu/capture_sglang.py; docs/gpu.md): kvqual reads each recording as it reads a
live server, and tests/fakesglang.py answers in the same shapes. When the engine and the fake
disagree, the engine is right and the fake follows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvqual.client import parse_chat, parse_completion
from kvqual.forcing.sglang import parse_scores, score_payload
from kvqual.probe import engine_of, parse_prometheus, reported_kv_capacity
from kvqual.telemetry import snapshot, source_of
from test_sglang import FakeSglang, _server

RECORDED = Path(__file__).with_name("fixtures") / "sglang-0.5.17"


def rec(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / f"{name}.json").read_text(encoding="utf-8"))


def test_the_native_generate_scores_parse_position_by_position() -> None:
    r = rec("generate_score")
    body = r["request"]["body"]
    assert body == score_payload(body["input_ids"], 5)  # the request kvqual sends
    lp = parse_scores(r["body"], 5, "sglang")
    ids = body["input_ids"]
    assert lp.token_ids == tuple(ids) and lp.token_logprobs[0] is None
    assert all(isinstance(x, float) for x in lp.token_logprobs[1:])
    assert all(len(top) == 5 for top in lp.top_logprobs[1:])


def test_generations_carry_the_ids_kvqual_forces_by() -> None:
    comp = rec("completion")
    ans = parse_completion(comp["body"], 5, "sglang")
    ids = comp["body"]["choices"][0]["token_ids"]
    assert ans.logprobs is not None and ans.logprobs.token_ids == tuple(ids) and len(ids) == 8
    assert comp["body"]["choices"][0]["logprobs"]["text_offset"] == [-1] * 8  # why the text fallback cannot work
    chat = parse_chat(rec("chat")["body"], 5, "sglang")
    assert chat.logprobs is not None and chat.logprobs.token_ids


def test_tokenize_answers_prompts_and_messages_with_the_exported_tokenizer() -> None:
    """The export writes model_max_length (8192): before, SGLang answered every /tokenize with a 500."""
    for name in ("tokenize_prompt", "tokenize_messages"):
        r = rec(name)
        assert r["status"] == 200 and r["body"]["max_model_len"] == 8192 and r["body"]["tokens"]
    assert rec("tokenize_prompt")["body"]["tokens"] == rec("completion")["body"]["choices"][0]["prompt_token_ids"]


def test_server_info_and_metrics_say_sglang_its_dtype_and_capacity() -> None:
    si = rec("server_info")["body"]
    metrics = parse_prometheus(rec("metrics")["body"])
    info = {"server_info": si}
    assert engine_of(info, metrics) == "sglang"
    assert reported_kv_capacity(info) == 32000 == si["max_total_num_tokens"]
    assert si["kv_cache_dtype"] == "auto"  # a bf16 cache is "auto" in SGLang's own words
    assert source_of(metrics) is not None and snapshot(metrics)


def test_the_openai_echo_is_refused_so_scoring_goes_native() -> None:
    r = rec("echo")
    assert r["status"] == 400 and "max_tokens must be positive" in r["body"]["message"]


@pytest.fixture(scope="module")
def fake() -> Any:
    yield from _server("--kv-cache-dtype", "bf16", "--enable-metrics", "--max-total-num-tokens", "32000")


def _keys(x: Any) -> set[str]:
    return set(x) if isinstance(x, dict) else set()


def test_the_fake_answers_in_the_engines_shapes(fake: FakeSglang) -> None:
    got = fake.post("/generate", score_payload([1, 2, 3, 4], 5))
    real = rec("generate_score")["body"]
    assert {"text", "output_ids", "meta_info"} <= _keys(got)
    want_meta = {"input_token_logprobs", "input_top_logprobs", "prompt_tokens", "finish_reason"}
    assert want_meta <= _keys(real["meta_info"]) and want_meta <= _keys(got["meta_info"])
    assert real["meta_info"]["input_token_logprobs"][0][0] is None and got["meta_info"]["input_token_logprobs"][0][0] is None
    assert real["meta_info"]["finish_reason"] == {"type": "length", "length": 0} == got["meta_info"]["finish_reason"]
    tok = fake.post("/tokenize", {"model": "m", "prompt": "The capital of France is"})
    assert {"tokens", "count", "max_model_len"} <= _keys(tok) and _keys(rec("tokenize_prompt")["body"]) == _keys(tok)


def test_scoring_steps_start_at_logprob_start_len_and_the_next_finds_the_first_cached() -> None:
    """Scoring through the cache (forcing/sglang.py): after a flush, ids[:12] scored from 10, then ids[:13]
    from 11. Each answer starts at logprob_start_len with a None entry; the second matched 11 tokens of
    prefix, the first's ids (all but its own last, which the cap at logprob_start_len keeps out)."""
    from kvqual.forcing.sglang import cached_tokens

    got = []
    for name in ("generate_step_first", "generate_step_next"):
        r = rec(name)
        body = r["request"]["body"]
        start = body["logprob_start_len"]
        assert body == score_payload(body["input_ids"], 5, start)  # the request kvqual sends
        lp = parse_scores(r["body"], 5, "sglang")
        assert lp.token_ids == tuple(body["input_ids"][start:]) and lp.token_logprobs[0] is None
        assert isinstance(lp.token_logprobs[1], float) and len(lp.top_logprobs[1]) == 5
        got.append((start, cached_tokens(r["body"])))
    assert got == [(10, 0), (11, 11)]


def test_the_fake_keeps_and_reports_the_cache_as_the_engine_does(fake: FakeSglang) -> None:
    import httpx

    ids = list(range(1, 14))
    httpx.post(f"{fake.root}/flush_cache", timeout=10).raise_for_status()
    first = fake.post("/generate", score_payload(ids[:12], 5, 10))
    again = fake.post("/generate", score_payload(ids[:13], 5, 11))
    real = rec("generate_step_next")["body"]["meta_info"]
    assert "cached_tokens" in real and "cached_tokens" in again["meta_info"]
    assert (first["meta_info"]["cached_tokens"], again["meta_info"]["cached_tokens"]) == (0, 11)
    assert [e[1] for e in again["meta_info"]["input_token_logprobs"]] == ids[11:13]
    assert again["meta_info"]["input_token_logprobs"][0][0] is None
