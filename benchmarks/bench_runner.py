"""Runner throughput (requests/s, top-5 logprobs, concurrency 64) against a zero-work local
server, side by side with a bare AsyncOpenAI loop (httpx), the same on aiohttp, a raw aiohttp
loop (the practical limit here) and lm-eval's local-completions on the same prompts.

    .venv/bin/python -m pytest benchmarks/bench_runner.py --benchmark-enable -s -q

Prints requests/s for each; never asserts a timing.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from kvtest import start_fake  # noqa: E402

from kvqual.config import RunDefaults, Target  # noqa: E402
from kvqual.records import GenerationParams, Item, SuiteRef  # noqa: E402
from kvqual.runner import RunPlan, execute, new_manifest  # noqa: E402
from kvqual.store import RunStore  # noqa: E402
from kvqual.suites import LoadedSuite  # noqa: E402

N, CONCURRENCY, TOPK = 2000, 64, 5
RESULTS: dict[str, float] = {}


@pytest.fixture(scope="module")
def server():
    s = start_fake()
    yield s
    s.stop()


def prompts() -> list[str]:
    return [f"prompt number {i}" for i in range(N)]


def body(prompt: str) -> dict:
    return {"model": "fake-model", "prompt": prompt, "max_tokens": 16, "temperature": 0, "logprobs": TOPK}


async def _bounded(make_call) -> None:
    it = iter(prompts())

    async def worker():
        for p in it:
            await make_call(p)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))


def _rate(name: str, fn) -> float:
    t0 = time.perf_counter()
    fn()
    rate = N / (time.perf_counter() - t0)
    RESULTS[name] = rate
    print(f"\n{name:<28}{rate:8.0f} req/s")
    return rate


def run_kvqual(url: str) -> None:
    items = tuple(Item(id=str(i), suite="bench", prompt=p) for i, p in enumerate(prompts()))
    suite = LoadedSuite(SuiteRef("bench", "bench", "x", N), items)
    target = Target(name="bench", base_urls=(url,))
    params = GenerationParams(max_tokens=16, top_logprobs=TOPK)
    plan = RunPlan(target, "fake-model", (suite,), params)
    with tempfile.TemporaryDirectory() as d:
        run = RunDefaults(results_dir=d, concurrency=CONCURRENCY)
        store = RunStore.open(d, new_manifest(plan, CONCURRENCY, {}))
        asyncio.run(execute(plan, store, run, progress=False))


def run_openai(url: str, aio: bool) -> None:
    async def main():
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0,
                                    http_client=openai.DefaultAioHttpClient() if aio else None)
        await _bounded(lambda p: client.completions.create(**body(p)))
        await client.close()
    asyncio.run(main())


def run_raw_aiohttp(url: str) -> None:
    async def main():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as s:
            async def call(p):
                async with s.post(f"{url}/completions", json=body(p)) as r:
                    await r.json()
            await _bounded(call)
    asyncio.run(main())


def run_lmeval(url: str) -> None:
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.api.instance import Instance

    lm = LocalCompletionsAPI(model="fake-model", base_url=f"{url}/completions", tokenized_requests=False,
                             num_concurrent=CONCURRENCY, max_retries=1, tokenizer_backend=None)
    reqs = [Instance("generate_until", {}, (p, {"until": ["\n\n"], "max_gen_toks": 16}), i)
            for i, p in enumerate(prompts())]
    lm.generate_until(reqs, disable_tqdm=True)


@pytest.mark.parametrize("name", ["kvqual runner", "AsyncOpenAI (httpx)", "AsyncOpenAI (aiohttp)",
                                  "raw aiohttp loop", "lm-eval local-completions"])
def test_throughput(benchmark, server, name):
    fns = {"kvqual runner": lambda: run_kvqual(server.base_url),
           "AsyncOpenAI (httpx)": lambda: run_openai(server.base_url, False),
           "AsyncOpenAI (aiohttp)": lambda: run_openai(server.base_url, True),
           "raw aiohttp loop": lambda: run_raw_aiohttp(server.base_url),
           "lm-eval local-completions": lambda: run_lmeval(server.base_url)}
    benchmark.pedantic(lambda: _rate(name, fns[name]), rounds=1, iterations=1)
    assert RESULTS[name] > 0
