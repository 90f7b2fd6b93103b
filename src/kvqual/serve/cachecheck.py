"""What the prefix cache does to outputs, measured in-process: warm vs cold greedy agreement, the
`stale-cache-block` fault, and how often a warm fp8 request's adopted scales differ from the
ones a cold prefill would calibrate (docs/serve.md, "Prefix cache and hierarchical cache").

    python -m kvqual.serve.cachecheck --docs 8 --max-tokens 24 --threads 2

The prompts are the cache-path probe's own (the built-in suite `shared_prefix`): each document
(filler with one secret number per question) is asked 4 questions, the document first and the
question last, so a document's prompts share every token up to the question. Each server gets
the same two waves: every document's first question (cold), then all the others at once (warm
where prefix caching is on), so the batches are the same in every run and a difference comes
from the cache path alone.
"""

from __future__ import annotations

import argparse
import statistics
import threading
from dataclasses import dataclass

import torch

from kvqual.serve.engine import Generation, SamplingParams
from kvqual.serve.kvcache import KvCache
from kvqual.serve.prefixcache import block_keys
from kvqual.serve.server import build_state
from kvqual.suites.generated import SHARED_PER_DOC, generate


@dataclass(frozen=True)
class Prompt:
    doc: str
    wave: int
    ids: tuple[int, ...]
    answer: str


def shared_document_prompts(tokenizer, docs: int, seed: int = 0) -> list[Prompt]:
    """The first `docs` documents of the built-in `shared_prefix` suite (the cache-path probe
    `kvqual compare --suite profile:cache` sends: 4 questions per document, 768 / 1,536 tokens of
    filler in turn), rendered with the model's chat template as kvqual serve renders a chat request."""
    prompts = []
    for item in generate("shared_prefix", seed=seed, limit=docs * SHARED_PER_DOC):
        rendered = tokenizer.apply_chat_template(list(item.messages), tokenize=False, add_generation_prompt=True)
        ids = tuple(tokenizer(rendered, add_special_tokens=False).input_ids)
        prompts.append(Prompt(str(item.context_id), int(item.meta["cache_wave"]), ids, str(item.answer)))
    return prompts


def _run_waves(engine, prompts: list[Prompt], max_tokens: int) -> list[Generation]:
    """Submit wave 0 at once, wait, then wave 1 at once; greedy, with output logprobs."""
    results: list[Generation | None] = [None] * len(prompts)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0)
    for wave in (0, 1):
        todo = [i for i, p in enumerate(prompts) if p.wave == wave]
        done = threading.Semaphore(0)

        def deliver(i: int, result) -> None:
            results[i] = result
            done.release()

        for i in todo:
            engine.submit(prompts[i].ids, params, lambda r, i=i: deliver(i, r))
        for _ in todo:
            done.acquire()
    for r in results:
        if not isinstance(r, Generation):
            raise RuntimeError(f"generation failed: {r}")
    return results  # type: ignore[return-value]


def _cold_scales(state, ids: tuple[int, ...]) -> torch.Tensor:
    """The fp8 scales [layers, 2] a cold prefill of `ids` calibrates (the engine is idle)."""
    loaded = state.loaded
    cache = KvCache(loaded.num_layers, state.config.kv_cache_dtype, state.config.kv_scale)
    x = torch.tensor([ids])
    with torch.inference_mode():
        loaded.model.get_decoder()(input_ids=x, position_ids=torch.arange(len(ids)).unsqueeze(0),
                                   attention_mask=torch.ones_like(x), cache=cache, use_cache=True)
    return torch.stack([torch.cat([t.reshape(1) for t in layer.scales()]) for layer in cache.layers])


def compare(prompts: list[Prompt], run: list[Generation], ref: list[Generation], idx: list[int]) -> str:
    """Requests `idx` of `run` against the same requests of `ref`: cached tokens, same greedy output,
    the first output token's |logprob difference| (median, max), accuracy (ref's in brackets)."""
    if not idx:
        return "none"
    delta = sorted(abs(run[i].output_logprobs[0].logprob - ref[i].output_logprobs[0].logprob) for i in idx)
    cached = statistics.mean(run[i].cached_tokens or 0 for i in idx)
    return (f"{len(idx)} requests, cached {cached:.0f} of {statistics.mean(len(prompts[i].ids) for i in idx):.0f} "
            f"prompt tokens; same output {sum(run[i].output_ids == ref[i].output_ids for i in idx)}/{len(idx)}; "
            f"first token |d logprob| median {statistics.median(delta):.4f}, max {delta[-1]:.4f}; "
            f"accuracy {sum(prompts[i].answer in run[i].text for i in idx)} "
            f"({sum(prompts[i].answer in ref[i].text for i in idx)})")


def measure(dtype: str, prompts: list[Prompt], max_tokens: int, kv_budget_mb: int) -> dict[str, object]:
    """One dtype: cold (no prefix cache), warm (prefix cache) and stale-cache-block runs of the same
    waves; each run's requests compared with the cold run's, split by whether the cache served them."""
    runs, scale_rows = {}, []
    for name, caching, fault in (("cold", False, "none"), ("warm", True, "none"), ("stale", True, "stale-cache-block")):
        state = build_state(None, dtype, "dynamic", 32, None, kv_budget_mb, fault, enable_prefix_caching=caching)
        try:
            runs[name] = _run_waves(state.engine, prompts, max_tokens)
            if name == "warm" and dtype != "bf16":
                store = state.engine.prefix_cache
                cold_scales = [_cold_scales(state, p.ids) for p in prompts]
                first = {p.doc: cold_scales[i] for i, p in enumerate(prompts) if p.wave == 0}
                for i, p in enumerate(prompts):
                    entry = store.entry(block_keys(p.ids)) if p.wave == 1 else None
                    if entry is not None:
                        scale_rows.append((entry.scales, cold_scales[i], first[p.doc]))
        finally:
            state.engine.shutdown()
    cold = runs["cold"]
    out: dict[str, object] = {"dtype": dtype, "requests": len(prompts),
                              "cold accuracy": f"{sum(p.answer in c.text for p, c in zip(prompts, cold))}/{len(prompts)}"}
    later = [i for i, p in enumerate(prompts) if p.wave == 1]
    for name in ("warm", "stale"):
        run = runs[name]
        unserved = [i for i, r in enumerate(run) if not r.cached_tokens]
        template = [i for i, r in enumerate(run) if r.cached_tokens and prompts[i].wave == 0]
        out[f"{name}: questions 2+ (document hits)"] = compare(prompts, run, cold, later)
        out[f"{name}: first questions served from cache (the chat template only)"] = compare(prompts, run, cold,
                                                                                              template)
        out[f"{name}: not served from cache, same output"] = (
            f"{sum(run[i].output_ids == cold[i].output_ids for i in unserved)}/{len(unserved)}")
    out["_cold"] = cold
    # fp8: the scales a warm request adopted (as served: shared namespace), and the ones one cache_salt
    # per document would give it (its document's first prompt's, calibrated cold), against its own cold ones
    for label, col in (("served", 0), ("one salt per document", 2)):
        if not scale_rows:
            break
        pairs = [(row[col], row[1]) for row in scale_rows]
        ratios = torch.cat([(a / c).reshape(-1) for a, c in pairs])
        off = ratios[ratios != 1]
        out[f"scales adopted ({label}): differ"] = f"{len(off)}/{len(ratios)}"
        out[f"scales adopted ({label}): differ > 1%"] = int(((ratios - 1).abs() > 0.01).sum())
        out[f"scales adopted ({label}): below cold (warm tokens' largest values clip)"] = int((ratios < 1).sum())
        out[f"scales adopted ({label}): adopted / cold range"] = ((round(off.min().item(), 4), round(off.max().item(), 4))
                                                                   if len(off) else None)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvqual.serve.cachecheck", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=8,
                        help=f"the first DOCS documents of the suite shared_prefix ({SHARED_PER_DOC} questions "
                             "each: 1 cold, the rest warm)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--dtypes", default="bf16,fp8_e4m3")
    parser.add_argument("--kv-budget-mb", type=int, default=1024,
                        help="large enough that no entry is evicted (the default server's 256 MB would be)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from kvqual.serve.model import load_model, resolve_source

    if args.docs < 1:
        parser.error("--docs must be at least 1")
    prompts = shared_document_prompts(load_model(resolve_source(None)).tokenizer, args.docs)
    colds = {}
    for dtype in args.dtypes.split(","):
        out = measure(dtype, prompts, args.max_tokens, args.kv_budget_mb)
        colds[dtype] = out.pop("_cold")
        for key, value in out.items():
            print(f"{key}: {value}", flush=True)
        print(flush=True)
    if "bf16" in colds and len(colds) > 1:  # the scale of fp8's own effect, for reference
        later = [i for i, p in enumerate(prompts) if p.wave == 1]
        for dtype, cold in colds.items():
            if dtype != "bf16":
                print(f"reference, {dtype} cold vs bf16 cold, questions 2+: "
                      f"{compare(prompts, cold, colds['bf16'], later)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
