"""The prefix cache on the real model over local HTTP: warm hits agree with cold prefills, echo
never reads, cached_tokens, salts, flush, metrics, the host tier and the stale-cache-block fault.

Warm against cold is judged against fp8's own rounding noise measured here (logprob_gaps.py), over
the tokens of 7 questions, never against a fixed figure: those depend on the CPU's kernels."""

import json

import httpx
import pytest

from logprob_gaps import FP8_PAIR_FACTOR, SAME_PATH_SHARE, Run, gaps, mean_gap, parts_only_at_near_ties

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
DOC = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based inks and a wooden press adapted from wine making. Books became cheaper, "
    "literacy spread, and scholars across Europe could compare identical copies of the same text. "
) * 2
QUESTIONS = ("\n\nQuestion: What did Gutenberg combine?\nAnswer:", "\n\nQuestion: What became cheaper?\nAnswer:",
             "\n\nQuestion: In which century does the history begin?\nAnswer:", "\n\nQuestion: What spread?\nAnswer:",
             "\n\nQuestion: What could scholars compare?\nAnswer:",
             "\n\nQuestion: Where was the press adapted from?\nAnswer:",
             "\n\nQuestion: Who combined movable type and ink?\nAnswer:",
             "\n\nQuestion: What kind of inks were used?\nAnswer:")
LATER = QUESTIONS[1:]  # asked after QUESTIONS[0] has put the document in the cache
ANSWER_TOKENS = 16
METRICS = ("prefix_cache_queries_total", "prefix_cache_hits_total", "hicache_host_hits_total",
           "prefix_cache_evictions_total", "prefix_cache_tokens", "hicache_host_tokens", "cache_hit_rate")


@pytest.fixture(scope="module")
def cached_bf16_url():
    from kvqual.serve import running_server

    with running_server(kv_cache_dtype="bf16", port=0, max_batch=4, enable_prefix_caching=True) as url:
        yield url


def _complete(url, prompt, max_tokens=12, **extra):
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 0, **extra}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _run(url, prompt):
    """Greedy, ANSWER_TOKENS tokens, with each position's top-2 (for near-ties) and the token ids."""
    response = _complete(url, prompt, max_tokens=ANSWER_TOKENS, logprobs=2, return_tokens_as_token_ids=True)
    return Run.of(response), response


def _cached(response):
    return response["usage"]["prompt_tokens_details"]["cached_tokens"]


def _metric(url, name):
    line = next(l for l in httpx.get(url + "/metrics").text.splitlines() if l.startswith(f"kvqual_serve:{name}{{"))
    return float(line.rsplit(" ", 1)[1])


def _flush(url):
    r = httpx.post(url + "/flush_cache")
    assert r.status_code == 200 and r.text.startswith("Cache flushed.")


@pytest.fixture(scope="module")
def cold(bf16_url, fp8_url):
    """The later questions prefilled cold on bf16 and on fp8 (servers without a prefix cache), and
    fp8's rounding noise on them: mean |Δ logprob| of fp8 against bf16 (~0.08-0.09 nats here)."""
    runs = {}
    for dtype, url in (("bf16", bf16_url), ("fp8", fp8_url)):
        runs[dtype] = []
        for q in LATER:
            run, response = _run(url, DOC + q)
            assert "prompt_tokens_details" not in response["usage"]  # a server without a prefix cache does not say
            runs[dtype].append(run)
    noise = gaps(runs["fp8"], runs["bf16"])
    assert len(noise) >= 20, f"fp8 against bf16: only {len(noise)} comparable tokens"
    runs["noise"] = sum(noise) / len(noise)
    return runs


def _warm_runs(cached_url):
    """Each later question on an empty cache after QUESTIONS[0] put the document there: every one is
    warm from that one entry (it adopts its fp8 scales), none from another later question's entry."""
    shared = len(httpx.post(cached_url + "/tokenize", json={"prompt": DOC}).json()["tokens"])
    runs = []
    for q in LATER:
        _flush(cached_url)
        assert _cached(_complete(cached_url, DOC + QUESTIONS[0], max_tokens=1)) == 0
        run, response = _run(cached_url, DOC + q)
        n = _cached(response)  # every full block of the shared document (and of the "Question: " after it)
        assert n % 16 == 0 and shared - 16 < n < response["usage"]["prompt_tokens"]
        runs.append(run)
    return runs


def test_bf16_warm_hits_match_cold(cached_bf16_url, bf16_url, cold):
    _flush(cached_bf16_url)
    first = _complete(cached_bf16_url, DOC + QUESTIONS[0])
    assert _cached(first) == 0  # a miss is the cold computation itself: the same numbers on any CPU
    assert first["choices"][0]["logprobs"] == _complete(bf16_url, DOC + QUESTIONS[0])["choices"][0]["logprobs"]
    warm = _warm_runs(cached_bf16_url)
    gap, noise = mean_gap(warm, cold["bf16"]), cold["noise"]
    print(f"bf16 warm vs cold: mean |Δ logprob| {gap:.5f} over {len(gaps(warm, cold['bf16']))} tokens; "
          f"fp8's rounding noise {noise:.4f}")
    # not bit for bit: the rest of the prompt is prefilled as a shorter matrix, whose float32 rounding
    # differs by CPU (this Xeon: ~0.002 nats, 1/40 of fp8's noise; with SSE kernels: 0)
    assert gap <= SAME_PATH_SHARE * noise, (gap, noise)
    assert parts_only_at_near_ties(warm, cold["bf16"], tie=noise) == []


def test_fp8_warm_hits_stay_within_fp8_rounding_noise(fp8_url, cold):
    from kvqual.serve import running_server

    with running_server(kv_cache_dtype="fp8_e4m3", port=0, max_batch=4, enable_prefix_caching=True) as url:
        warm = _warm_runs(url)
        _flush(url)
        first, _ = _run(url, DOC + QUESTIONS[0])
        again, response = _run(url, DOC + QUESTIONS[0])  # the same prompt: its own scales, its own K/V
    assert _cached(response) > 0
    # another question adopts the first prompt's scales (prefixcache.py): its K/V are another fp8
    # rounding of the prompt than a cold prefill's, which calibrates its own. Each is one fp8 rounding
    # away from bf16, so the two may be up to two apart (logprob_gaps.py), and greedy text may differ
    # (measured: the same on 2-5 of 7 questions, by kernel set). A single token's gap is no yardstick:
    # 0.139 nats on a Zen 5 EPYC against < 0.1 on this Xeon (issue 37), 0.03-0.45 across questions here.
    gap, noise = mean_gap(warm, cold["fp8"]), cold["noise"]
    again_gap = mean_gap([again], [first])
    print(f"fp8 warm vs cold: mean |Δ logprob| {gap:.4f} over {len(gaps(warm, cold['fp8']))} tokens, "
          f"its own entry again {again_gap:.4f}; fp8's rounding noise {noise:.4f}")
    assert gap <= FP8_PAIR_FACTOR * noise, (gap, noise)
    assert again_gap <= FP8_PAIR_FACTOR * noise, (again_gap, noise)


def test_usage_metrics_and_flush(cached_bf16_url):
    _flush(cached_bf16_url)
    before = {name: _metric(cached_bf16_url, name) for name in METRICS}
    assert before["prefix_cache_tokens"] == 0 and before["hicache_host_tokens"] == 0
    a = _complete(cached_bf16_url, DOC + QUESTIONS[0], max_tokens=2)
    b = _complete(cached_bf16_url, DOC + QUESTIONS[1], max_tokens=2)
    hits = _metric(cached_bf16_url, "prefix_cache_hits_total") - before["prefix_cache_hits_total"]
    queries = _metric(cached_bf16_url, "prefix_cache_queries_total") - before["prefix_cache_queries_total"]
    assert (_cached(a), hits) == (0, _cached(b)) and queries == a["usage"]["prompt_tokens"] + b["usage"]["prompt_tokens"]
    assert _metric(cached_bf16_url, "prefix_cache_tokens") > 0 and 0 < _metric(cached_bf16_url, "cache_hit_rate") < 1
    text = httpx.get(cached_bf16_url + "/metrics").text
    for name in METRICS:
        assert f"# TYPE kvqual_serve:{name} " in text
        assert f'kvqual_serve:{name}{{model_name="{MODEL}",kv_cache_dtype="bf16",kv_scale="dynamic"}} ' in text
    stream = {"model": MODEL, "prompt": DOC + QUESTIONS[1], "max_tokens": 2, "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}}
    with httpx.stream("POST", cached_bf16_url + "/v1/completions", json=stream, timeout=120) as r:
        events = [json.loads(l[6:]) for l in r.iter_lines() if l.startswith("data: {")]
    n = b["usage"]["prompt_tokens"]  # b's own blocks are cached now: all but the last token's block
    assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16 > _cached(b)
    info = httpx.get(cached_bf16_url + "/get_server_info").json()
    flags = info["enable_prefix_caching"], info["disable_radix_cache"], info["enable_hierarchical_cache"]
    assert flags == (True, False, False)
    assert (info["hicache_size"], info["hicache_ratio"], info["prefix_cache_block_size"]) == (0.0, 2.0, 16)
    _flush(cached_bf16_url)
    assert _metric(cached_bf16_url, "prefix_cache_tokens") == 0
    assert _cached(_complete(cached_bf16_url, DOC + QUESTIONS[1], max_tokens=2)) == 0
    assert httpx.post(cached_bf16_url + "/reset_prefix_cache").status_code == 200
    assert _cached(_complete(cached_bf16_url, DOC + QUESTIONS[1], max_tokens=2)) == 0


def test_echo_never_reads_but_writes(cached_bf16_url, bf16_url):
    _flush(cached_bf16_url)
    _complete(cached_bf16_url, DOC + QUESTIONS[0], max_tokens=1)
    echo = {"prompt": DOC + QUESTIONS[1], "max_tokens": 0, "echo": True}
    scored = _complete(cached_bf16_url, **echo)
    assert _cached(scored) == 0  # teacher forcing computes every position fresh
    assert scored["choices"][0]["logprobs"] == _complete(bf16_url, **echo)["choices"][0]["logprobs"]
    _flush(cached_bf16_url)
    _complete(cached_bf16_url, **echo)
    assert _cached(_complete(cached_bf16_url, DOC + QUESTIONS[1], max_tokens=1)) > 0  # it was cached


def test_cache_salt_isolates_and_is_validated(cached_bf16_url):
    _flush(cached_bf16_url)
    _complete(cached_bf16_url, DOC + QUESTIONS[0], max_tokens=1, cache_salt="run-a")
    assert _cached(_complete(cached_bf16_url, DOC + QUESTIONS[1], max_tokens=1, cache_salt="run-b")) == 0
    assert _cached(_complete(cached_bf16_url, DOC + QUESTIONS[1], max_tokens=1)) == 0
    assert _cached(_complete(cached_bf16_url, DOC + QUESTIONS[1], max_tokens=1, cache_salt="run-a")) > 0
    chat = {"model": MODEL, "messages": [{"role": "user", "content": DOC}], "max_tokens": 1, "cache_salt": "run-a"}
    first = httpx.post(cached_bf16_url + "/v1/chat/completions", json=chat, timeout=120).json()
    again = httpx.post(cached_bf16_url + "/v1/chat/completions", json=chat, timeout=120).json()
    assert _cached(first) == 0 and _cached(again) > 0
    for bad in ("", 7):
        r = httpx.post(cached_bf16_url + "/v1/completions", json={"prompt": "x", "cache_salt": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
        assert r.json()["error"]["message"] == "Parameter 'cache_salt' must be a non-empty string if provided."


def test_host_tier_serves_what_the_budget_evicted():
    from kvqual.serve import running_server

    # 2 MB of bf16 KV: 91 tokens; a 40-token prompt + 8 output reserve 48, leaving 43 for the cache
    with running_server(kv_cache_dtype="bf16", port=0, max_batch=1, kv_budget_mb=2,
                        enable_hierarchical_cache=True, hicache_size=0.01) as url:
        info = httpx.get(url + "/get_server_info").json()
        assert info["enable_prefix_caching"] and info["enable_hierarchical_cache"] and info["hicache_size"] == 0.01
        ids_a, ids_b = list(range(1000, 1040)), list(range(2000, 2040))
        assert _cached(_complete(url, ids_a, max_tokens=8)) == 0
        device = _complete(url, ids_a, max_tokens=8)  # warm from the device store
        assert _cached(device) == 32 and _metric(url, "hicache_host_hits_total") == 0
        _complete(url, ids_b, max_tokens=8)  # evicts a's 32 tokens to the host tier
        assert _metric(url, "prefix_cache_tokens") <= 43 and _metric(url, "hicache_host_tokens") == 32
        assert _metric(url, "prefix_cache_evictions_total") == 1
        warm = _complete(url, ids_a, max_tokens=8)
        assert _cached(warm) == 32 and _metric(url, "hicache_host_hits_total") == 32
        # the host tier is a byte round trip: the same computation as the hit from the device store, so
        # the same numbers on any CPU (warm against cold is test_bf16_warm_hits_match_cold's)
        assert warm["choices"][0]["logprobs"] == device["choices"][0]["logprobs"]
        assert _metric(url, "prefix_cache_tokens") <= 43


def test_stale_cache_block_changes_warm_outputs_only(bf16_url):
    from kvqual.serve import running_server

    with running_server(kv_cache_dtype="bf16", port=0, max_batch=4, enable_prefix_caching=True,
                        kv_fault="stale-cache-block") as url:
        info = httpx.get(url + "/get_server_info").json()
        assert (info["kv_cache_dtype"], info["kv_fault"]) == ("bf16", "stale-cache-block")
        cold = _complete(url, DOC + QUESTIONS[0])
        assert _cached(cold) == 0
        assert cold["choices"][0]["logprobs"] == _complete(bf16_url, DOC + QUESTIONS[0])["choices"][0]["logprobs"]
        warm = _complete(url, DOC + QUESTIONS[1])
    healthy = _complete(bf16_url, DOC + QUESTIONS[1])
    assert _cached(warm) > 0 and warm["choices"][0]["text"] != healthy["choices"][0]["text"]
