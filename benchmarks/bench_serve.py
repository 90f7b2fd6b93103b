"""Throughput of `kvqual serve` (tokens/s at concurrency 1, 16 and 32, bf16 vs fp8_e4m3) and the
bf16-vs-fp8 acceptance figures. Prints numbers; asserts nothing about timings.

Run: .venv/bin/python -m pytest benchmarks/bench_serve.py -s -q --benchmark-enable
"""

import asyncio
import time

import openai
import pytest

from kvqual.serve import running_server

MODEL = "SmolLM2-135M-Instruct"
MAX_TOKENS = 64
TOPICS = ["rain", "cats", "the moon", "bread", "rivers", "chess", "winter", "music", "bees", "glass", "trains",
          "salt", "maps", "owls", "tea", "volcanoes", "paper", "clocks", "whales", "copper", "gardens", "kites",
          "deserts", "bridges"]
PARAGRAPHS = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based inks and a wooden press adapted from wine making.",
    "Photosynthesis converts light energy into chemical energy: chlorophyll absorbs red and blue light, "
    "water is split, oxygen is released, and carbon dioxide is fixed into sugars in the Calvin cycle.",
    "A binary search halves the interval at each step, so a sorted list of a million items needs at most "
    "twenty comparisons; the same idea underlies bisection methods for finding roots of equations.",
    "The river delta shifted its channels every few centuries, leaving behind abandoned levees, oxbow lakes "
    "and fertile plains that farmers have cultivated for thousands of years.",
    "In the orchestra the strings sit in front, the woodwinds behind them, and the brass and percussion at the "
    "back, so that the louder instruments do not drown out the quieter ones.",
]


def _chat(content):
    return [{"role": "user", "content": content}]


async def _fire(url, n, max_tokens):
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    prompts = [_chat(f"Write a long story about {TOPICS[i % len(TOPICS)]}.") for i in range(n)]
    t0 = time.perf_counter()
    rs = await asyncio.gather(*(client.chat.completions.create(model=MODEL, messages=p, max_tokens=max_tokens,
                                                                temperature=0) for p in prompts))
    return sum(r.usage.completion_tokens for r in rs), time.perf_counter() - t0


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_throughput(benchmark, kv):
    with running_server(kv_cache_dtype=kv, port=0) as url:  # the default --max-batch (32)
        asyncio.run(_fire(url, 1, 4))  # warm-up
        figures = {}

        def run():
            for conc, rounds in ((1, 3), (16, 1), (32, 1)):
                tokens, secs = 0, 0.0
                for _ in range(rounds):
                    t, s = asyncio.run(_fire(url, conc, MAX_TOKENS))
                    tokens, secs = tokens + t, secs + s
                figures[conc] = tokens / secs

        benchmark.pedantic(run, rounds=1, iterations=1)
        benchmark.extra_info.update({f"tok_per_s_c{c}": round(v, 1) for c, v in figures.items()})
        print(f"\n[{kv}] tokens/s: concurrency 1 = {figures[1]:.1f}, 16 = {figures[16]:.1f} "
              f"({figures[16] / figures[1]:.1f}x), 32 = {figures[32]:.1f} ({figures[32] / figures[1]:.1f}x)")


def _long_text(client, target=1500):
    text, i = "", 0
    while True:
        text += PARAGRAPHS[i % len(PARAGRAPHS)] + " "
        i += 1
        if i % 5 == 0:
            n = client.post("/tokenize", body={"prompt": text}, cast_to=object)["count"]
            if n >= target:
                return text, n


def test_acceptance_bf16_vs_fp8(benchmark):
    """Echo scoring of a ~1,500-token text and greedy divergence on 24 prompts, bf16 vs fp8_e4m3."""
    results = {}
    with running_server(kv_cache_dtype="bf16", port=0) as b_url, running_server(kv_cache_dtype="fp8_e4m3", port=0) as f_url:
        clients = {k: openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=600)
                   for k, u in (("bf16", b_url), ("fp8", f_url))}
        bare = openai.OpenAI(base_url=b_url, api_key="none")
        text, n = _long_text(bare)

        def run():
            echo = {k: c.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True, logprobs=0)
                    .choices[0].logprobs.token_logprobs[1:] for k, c in clients.items()}
            diffs = [abs(a - b) for a, b in zip(echo["bf16"], echo["fp8"])]
            results["echo"] = (n, sum(diffs) / len(diffs), max(diffs))
            prompts = [_chat(f"Write two sentences about {t}.") for t in TOPICS]

            async def batch(url):
                ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
                rs = await asyncio.gather(*(ac.chat.completions.create(model=MODEL, messages=p, max_tokens=48,
                                                                        temperature=0) for p in prompts))
                return [r.choices[0].message.content for r in rs]

            bb, ff = asyncio.run(batch(b_url)), asyncio.run(batch(f_url))
            single = [clients["bf16"].chat.completions.create(model=MODEL, messages=p, max_tokens=48, temperature=0)
                      .choices[0].message.content for p in prompts]
            results["diverge_bf16_fp8"] = sum(a != b for a, b in zip(bb, ff))
            results["diverge_batched_single"] = sum(a != b for a, b in zip(bb, single))

        benchmark.pedantic(run, rounds=1, iterations=1)
    n, mean_d, max_d = results["echo"]
    print(f"\necho scoring {n} tokens: mean |dlogprob| bf16 vs fp8_e4m3 = {mean_d:.4f} nats (max {max_d:.3f})")
    print(f"greedy (48 tokens, 24 prompts, batched): bf16 vs fp8_e4m3 differ on {results['diverge_bf16_fp8']}/24")
    print(f"bf16 batched(24) vs single-stream greedy: differ on {results['diverge_batched_single']}/24")
    benchmark.extra_info.update({"echo_tokens": n, "mean_abs_dlogprob": mean_d, **{k: v for k, v in results.items()
                                                                                    if k != "echo"}})
