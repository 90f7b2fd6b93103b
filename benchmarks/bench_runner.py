"""Client cost per request of kvqual's runner beside other clients: same payload, same answers.

    .venv/bin/python -m pytest benchmarks/bench_runner.py --benchmark-enable -s -q

Every contender sends kvqual's /v1/completions body (max_tokens 256, temperature 0, top_p 1,
seed 1234, `logprobs: 5`) to the local fake server (tests/fakeserver.py --answer-tokens 256),
which answers every prompt with 256 tokens, each with its logprob and a top-5 map (~48 KB of
JSON). After each timed pass the answers are counted, untimed: N of them, 256 tokens and 5
alternatives each.

- kvqual runner: `runner.execute`, as `kvqual run` sends: every answer read (capped), decoded
  (NaN and overflow refused), its logprobs checked, its Sample appended to the run folder (a
  temporary one). Its per-run costs (plan order, telemetry, manifest) are in the figure too,
  spread over N requests.
- AsyncOpenAI (httpx / aiohttp): `client.completions.create(**body)`, into the SDK's pydantic objects.
- raw aiohttp: `session.post(json=body)` and `await response.json()`, nothing else.
- lm-eval local-completions: `LocalCompletionsAPI.generate_until`, with `logprobs: 5` and `top_p`
  in gen_kwargs (its `_create_payload` puts unknown gen_kwargs into the body as they are).
  Unavoidable differences: its body also has `"stop": []` (from `until`; the fake ignores it),
  and it has no seed per request other than its own (1234, the same here). It parses the whole
  answer (`response.json()`) but keeps only the text: it neither checks nor stores the logprobs,
  so its answers are counted by their text's 256 tokens. Its progress bar (drawn whatever
  `disable_tqdm` says) goes to /dev/null.

Figures, side by side from one run: requests/s (wall clock) and client CPU ms per request
(`time.process_time()` of this process around the pass). The fake server is another process:
its CPU is not counted, but it shares the machine's cores, so wall-clock figures also show what
else runs there; CPU per request is the figure to compare. Each contender is warmed up first
(imports, first connections); then ROUNDS rounds, every contender once a round in a rotating
order, so a change in background load falls on all of them; the table gives medians.
`test_where_kvqual_spends_it` takes kvqual's pass apart by replacing one step at a time.
Never asserts a timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import aiohttp
import openai
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fakeserver import tokenize  # noqa: E402
from kvtest import start_fake  # noqa: E402

from kvqual import bodies, client, runner, store  # noqa: E402
from kvqual.client import completion_payload  # noqa: E402
from kvqual.config import RunDefaults, Target  # noqa: E402
from kvqual.records import GenerationParams, Item, SuiteRef  # noqa: E402
from kvqual.plan import RunPlan  # noqa: E402
from kvqual.runner import execute, new_manifest  # noqa: E402
from kvqual.store import RunStore, load_samples  # noqa: E402
from kvqual.suites import LoadedSuite  # noqa: E402

N = int(os.environ.get("KVQUAL_BENCH_N", "1000"))
ROUNDS = int(os.environ.get("KVQUAL_BENCH_ROUNDS", "3"))
CONCURRENCY, TOKENS, TOPK, WARMUP = 64, 256, 5, 32
PARAMS = GenerationParams(max_tokens=TOKENS, top_logprobs=TOPK)
MODEL = "fake-model"

Shape = tuple[int, int]  # (tokens, alternatives at the first token) of one answer
Pass = tuple[Callable[[], None], Callable[[], list[Shape]]]  # (the timed pass, its answers' shapes after)


@pytest.fixture(scope="module")
def server():
    s = start_fake("--answer-tokens", str(TOKENS))
    yield s
    s.stop()


def prompts(n: int, salt: str) -> list[str]:
    return [f"prompt {salt} number {i}" for i in range(n)]


def body(prompt: str) -> dict:
    """kvqual's own request body, so every contender sends the same."""
    return completion_payload(Item(id="", suite="bench", prompt=prompt), PARAMS, MODEL)


async def _bounded(ps: list[str], call) -> list[Shape]:
    it, shapes = iter(ps), []

    async def worker():
        for p in it:
            shapes.append(await call(p))

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return shapes


def _kept(main) -> Pass:
    """A pass whose answers' shapes are what `main()` returns."""
    kept: list[Shape] = []
    return (lambda: kept.extend(main())), (lambda: kept)


def run_kvqual(url: str, ps: list[str], count: bool = True) -> Pass:
    """`count=False`: a pass whose steps are replaced stores nothing to count; its folder is removed all the same."""
    items = tuple(Item(id=str(i), suite="bench", prompt=p) for i, p in enumerate(ps))
    suite = LoadedSuite(SuiteRef("bench", "bench", "x", len(ps)), items)
    plan = RunPlan(Target(name="bench", base_urls=(url,)), MODEL, (suite,), PARAMS)
    folder = tempfile.TemporaryDirectory()
    run = RunDefaults(results_dir=folder.name, concurrency=CONCURRENCY)
    store = RunStore.open(folder.name, new_manifest(plan, CONCURRENCY, {}))  # git revision etc.: not timed

    def go() -> None:
        asyncio.run(execute(plan, store, run, progress=False))

    def shapes() -> list[Shape]:
        with folder:
            if not count:
                return [(TOKENS, TOPK)] * len(ps)
            samples = list(load_samples(Path(folder.name) / plan.run_id).values())
        assert all(s.ok for s in samples), next(s.error for s in samples if not s.ok)
        return [(len(s.logprobs.tokens), len(s.logprobs.top_logprobs[0])) if s.logprobs else (0, 0) for s in samples]

    return go, shapes


def run_openai(url: str, ps: list[str], aio: bool) -> Pass:
    async def main() -> list[Shape]:
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0,
                                    http_client=openai.DefaultAioHttpClient() if aio else None)

        async def call(p: str) -> Shape:
            lp = (await client.completions.create(**body(p))).choices[0].logprobs
            return len(lp.tokens), len(lp.top_logprobs[0])

        try:
            return await _bounded(ps, call)
        finally:
            await client.close()

    return _kept(lambda: asyncio.run(main()))


def run_raw_aiohttp(url: str, ps: list[str]) -> Pass:
    async def main() -> list[Shape]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY)) as s:
            async def call(p: str) -> Shape:
                async with s.post(f"{url}/completions", json=body(p)) as r:
                    lp = (await r.json())["choices"][0]["logprobs"]
                    return len(lp["tokens"]), len(lp["top_logprobs"][0])

            return await _bounded(ps, call)

    return _kept(lambda: asyncio.run(main()))


def run_lmeval(url: str, ps: list[str]) -> Pass:
    import logging

    from lm_eval.api.instance import Instance
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    lm = LocalCompletionsAPI(model=MODEL, base_url=f"{url}/completions", tokenized_requests=False,
                             num_concurrent=CONCURRENCY, max_retries=1, tokenizer_backend=None,
                             max_gen_toks=TOKENS, seed=PARAMS.seed)
    gen_kwargs = {"until": [], "max_gen_toks": TOKENS, "temperature": PARAMS.temperature,
                  "top_p": PARAMS.top_p, "logprobs": TOPK}
    reqs = [Instance("generate_until", {}, (p, dict(gen_kwargs)), i) for i, p in enumerate(ps)]
    texts: list[str] = []

    def go() -> None:
        with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):  # its bar still draws (its cost counts), unseen
            texts.extend(lm.generate_until(reqs, disable_tqdm=True))

    return go, lambda: [(len(tokenize(t)), TOPK) for t in texts]  # the text only: lm-eval drops the logprobs


CONTENDERS: dict[str, Callable[[str, list[str]], Pass]] = {
    "kvqual runner": run_kvqual,
    "AsyncOpenAI (httpx)": lambda url, ps: run_openai(url, ps, aio=False),
    "AsyncOpenAI (aiohttp)": lambda url, ps: run_openai(url, ps, aio=True),
    "raw aiohttp": run_raw_aiohttp,
    "lm-eval local-completions": run_lmeval,
}


def one_pass(make: Callable[[str, list[str]], Pass], url: str, ps: list[str]) -> tuple[float, float]:
    """(req/s, client CPU ms per request) of one timed pass over `ps`; its answers are counted after."""
    go, shapes = make(url, ps)
    cpu0, t0 = time.process_time(), time.perf_counter()
    go()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert shapes() == [(TOKENS, TOPK)] * len(ps), "every contender gets the same answers"
    return len(ps) / wall, 1000 * cpu / len(ps)


Patch = Callable[[pytest.MonkeyPatch], None]


def rounds(benchmark, url: str, runs: dict[str, tuple[Patch | None, Callable[[str, list[str]], Pass]]]
           ) -> dict[str, list[tuple[float, float]]]:
    """Warm each up, then ROUNDS rounds of one pass each, in an order rotating by round. `runs`:
    name → (a patch applied during that pass and undone after, or None; the pass maker)."""
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    names = list(runs)

    def one(name: str, ps: list[str]) -> tuple[float, float]:
        patch, make = runs[name]
        with pytest.MonkeyPatch.context() as m:
            if patch is not None:
                patch(m)
            return one_pass(make, url, ps)

    for name in names:
        one(name, prompts(WARMUP, f"warmup-{name}"))
    done = iter(range(ROUNDS))

    def one_round() -> None:
        r = next(done)
        for name in names[r % len(names):] + names[:r % len(names)]:
            figures[name].append(one(name, prompts(N, f"{name}-{r}")))

    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1)
    return figures


def medians(passes: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(p[0] for p in passes), statistics.median(p[1] for p in passes)


def header(what: str) -> None:
    print(f"\n\n{what}: {N} requests a pass, concurrency {CONCURRENCY}, {TOKENS} tokens x top-{TOPK} an answer, "
          f"median of {ROUNDS} rounds; client CPU = time.process_time() of this process; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


def test_client_cost_side_by_side(benchmark, server):
    figures = rounds(benchmark, server.base_url, {name: (None, make) for name, make in CONTENDERS.items()})
    header("Client cost per request")
    print(f"{'contender':<28}{'req/s':>8}{'CPU ms/req':>12}")
    for name, passes in figures.items():
        rate, cpu = medians(passes)
        print(f"{name:<28}{rate:8.0f}{cpu:12.2f}")
        benchmark.extra_info[name] = {"requests_per_s": round(rate, 1), "cpu_ms_per_request": round(cpu, 3)}
    ours, theirs = figures["kvqual runner"], figures["lm-eval local-completions"]
    ratios = [a[1] / b[1] for a, b in zip(ours, theirs)]  # the two passes of one round ran minutes apart at most
    print(f"kvqual / lm-eval CPU per request, round by round: {' '.join(f'{r:.2f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.2f}, below 1 in {sum(r < 1 for r in ratios)} of {len(ratios)}")
    benchmark.extra_info["kvqual / lm-eval"] = round(statistics.median(ratios), 3)


def _without_store(m: pytest.MonkeyPatch) -> None:
    def append(self, sample):  # what the runner needs of it: the answered key
        if sample.ok:
            self.done.add(sample.key)
    m.setattr(store.RunStore, "append", append)


def _without_parse(m: pytest.MonkeyPatch) -> None:
    _without_store(m)
    answer = client.Answer(" ok", "length", 4, TOKENS, None)
    m.setattr(runner, "parse_completion", lambda data, want, server: answer)


def _plain_json(m: pytest.MonkeyPatch) -> None:
    _without_parse(m)
    m.setattr(bodies, "decode_json", lambda raw, server="server": json.loads(raw))


def test_where_kvqual_spends_it(benchmark, server):
    """kvqual's pass with one more step replaced each row; the differences are those steps' cost
    (the step replaced by nothing, or by `json.loads`; the answers are then not stored to count)."""
    uncounted = functools.partial(run_kvqual, count=False)
    figures = rounds(benchmark, server.base_url, {
        "kvqual runner": (None, run_kvqual),
        "without store.append": (_without_store, uncounted),
        "  and without parse": (_without_parse, uncounted),
        "  and plain json.loads": (_plain_json, uncounted),
        "raw aiohttp": (None, run_raw_aiohttp),
    })

    def step(more: str, less: str) -> float:  # per round (the two ran minutes apart at most), then the median
        return statistics.median(a[1] - b[1] for a, b in zip(figures[more], figures[less]))

    header("Where kvqual's client CPU goes")
    steps = [("store.append (samples.jsonl line, token data)", step("kvqual runner", "without store.append")),
             ("parse_completion (checks, TokenLogprobs)", step("without store.append", "  and without parse")),
             ("decode_json (orjson) over plain json.loads", step("  and without parse", "  and plain json.loads")),
             ("SDK transport and runner, over raw aiohttp", step("  and plain json.loads", "raw aiohttp")),
             ("raw aiohttp: HTTP and json.loads", medians(figures["raw aiohttp"])[1])]
    for what, ms in steps:
        print(f"{what:<48}{ms:8.2f} ms")
    print(f"{'kvqual runner (median pass)':<48}{medians(figures['kvqual runner'])[1]:8.2f} ms")
    print("each step: the median over rounds of the difference between two passes of one round; on a busy "
          "machine a pass varies by some tenths of a ms, so read steps that small as noise")
    benchmark.extra_info.update({what: round(ms, 3) for what, ms in steps})
