"""`--kv-fault` on the real model: silent (the server still reports fp8_e4m3), and it breaks scoring."""

import asyncio

import httpx
import openai
import pytest

from kvqual import probe

from logprob_gaps import token_gap

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
TEXT = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid."


@pytest.fixture(scope="module")
def broken_url():
    from kvqual.serve import running_server

    with running_server(kv_cache_dtype="fp8_e4m3", port=0, max_batch=4, kv_fault="ignore-scale-on-read") as url:
        yield url


def _echo(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    r = client.completions.create(model=MODEL, prompt=TEXT, max_tokens=0, echo=True, logprobs=0)
    return r.choices[0].logprobs.token_logprobs[1:]


def test_fault_is_reported_only_as_kv_fault(broken_url, bf16_url):
    info = asyncio.run(probe.describe(broken_url + "/v1", "none"))
    assert info["kv_cache_dtype"] == "fp8_e4m3"  # what a dtype check sees: nothing wrong
    assert info["server_info"]["kv_scale"] == "dynamic"
    assert info["server_info"]["kv_fault"] == "ignore-scale-on-read"
    assert 'kv_cache_dtype="fp8_e4m3"' in httpx.get(broken_url + "/metrics").text
    assert httpx.get(bf16_url + "/get_server_info").json()["kv_fault"] == "none"


def test_ignore_scale_on_read_wrecks_prompt_scoring(broken_url, bf16_url, fp8_url):
    good, bad, healthy = _echo(bf16_url), _echo(broken_url), _echo(fp8_url)
    assert len(good) == len(bad) == len(healthy)
    # a property of the model, not of the CPU: kernels move a bf16 logprob by ~1e-3 nats, not 1
    assert sum(good) / len(good) > -2.5  # the model knows these capitals
    # what the fault takes from the true text, per token, against what a healthy fp8 cache moves it on
    # the same text, measured here (logprob_gaps.py; the fault's own numbers are chaotic, docs/serve.md)
    drop, noise = (sum(good) - sum(bad)) / len(good), token_gap(healthy, good)
    print(f"the fault takes {drop:.2f} nats/token from the true text; fp8's rounding noise {noise:.4f}")
    assert drop > 50 * noise, (drop, noise)  # measured ~500x: no rounding, a broken cache
