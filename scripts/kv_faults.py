"""Measure `kvqual serve --kv-fault` on the real model, in one process (the weights load once).

For each KV config (bf16, fp8_e4m3, and fp8_e4m3 with each fault) it decodes the same built-in
items greedily through the reference engine (continuous batching, as the server does), then
teacher-forces bf16's completions through each config's KV cache and compares full-vocabulary
next-token distributions with bf16's: mean KL(bf16 || config) per completion token and the
share of tokens with the same top-1. It also reports how K/V values sit in e4m3's range at a
scale of 1.0 (why `drop-scale` is or is not harmful on this model).

    .venv/bin/python scripts/kv_faults.py --per-suite 8 --threads 2
    .venv/bin/python scripts/kv_faults.py --echo-consistency   # generation vs echo, single stream

Figures are quoted in docs/serve.md ("Fault modes").
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch

from kvqual.serve.engine import Generation, SamplingParams
from kvqual.serve.kvcache import KvCache, resolve_kv_cache_dtype
from kvqual.serve.server import build_state
from kvqual.suites import load_suites
from kvqual.suites.scorers import score

CONFIGS = (("bf16", "bf16", "none"), ("fp8_e4m3", "fp8_e4m3", "none"),
           ("fp8_e4m3+drop-scale", "fp8_e4m3", "drop-scale"),
           ("fp8_e4m3+ignore-scale-on-read", "fp8_e4m3", "ignore-scale-on-read"))
SUITES = ("arith", "kv_recall", "instruct", "long_decode", "passkey[len512]")


def prompt_ids(state, item) -> list[int]:
    if item.messages is not None:
        return state.encode_rendered(state.render_chat(tuple(item.messages)))
    return state.encode_text(item.prompt) if isinstance(item.prompt, str) else list(item.prompt)


def generate_all(state, prompts: list[list[int]], max_tokens: list[int]) -> list[Generation]:
    """Submit every prompt at once (the engine batches them) and wait for all."""
    results: list[Generation | BaseException | None] = [None] * len(prompts)
    done = threading.Semaphore(0)

    def deliver(i):
        def cb(result):
            results[i] = result
            done.release()
        return cb

    for i, (ids, n) in enumerate(zip(prompts, max_tokens)):
        state.engine.submit(ids, SamplingParams(max_tokens=n, temperature=0.0), deliver(i))
    for _ in prompts:
        done.acquire()
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


@torch.inference_mode()
def teacher_logprobs(loaded, dtype: str, fault: str, ids: list[int], n_prompt: int) -> torch.Tensor:
    """Log-softmax over the vocabulary at each completion position ([n_out, V]), one pass, as echo scoring."""
    cache = KvCache(loaded.num_layers, resolve_kv_cache_dtype(dtype), "dynamic", fault)
    x = torch.tensor([ids])
    hidden = loaded.model.get_decoder()(input_ids=x, position_ids=torch.arange(len(ids)).unsqueeze(0),
                                        attention_mask=torch.ones_like(x), cache=cache, use_cache=True).last_hidden_state[0]
    return loaded.model.get_output_embeddings()(hidden[n_prompt - 1 : len(ids) - 1]).float().log_softmax(-1)


@torch.inference_mode()
def range_at_scale_one(loaded, sequences: list[list[int]]) -> dict[str, float]:
    """Where bf16 K/V values fall in e4m3 at scale 1.0: amax, share past 448, share below 2**-10
    (half e4m3's smallest subnormal: they become 0) and below 2**-6 (its smallest normal: fewer bits)."""
    vals, amaxes = [], []
    for ids in sequences:
        cache = KvCache(loaded.num_layers, "bf16")
        x = torch.tensor([ids])
        loaded.model.get_decoder()(input_ids=x, position_ids=torch.arange(len(ids)).unsqueeze(0),
                                   attention_mask=torch.ones_like(x), cache=cache, use_cache=True)
        for layer in cache.layers:
            for t in layer.stored():
                vals.append(t.float().abs().flatten())
                amaxes.append(float(t.float().abs().max()))
    v = torch.cat(vals)
    return {"amax": float(v.max()), "median_layer_amax": sorted(amaxes)[len(amaxes) // 2],
            "min_layer_amax": min(amaxes),
            "share_over_448": float((v > 448).float().mean()),
            "share_flushed_to_0": float(((v < 2 ** -10) & (v > 0)).float().mean()),
            "share_under_2^-6": float(((v < 2 ** -6) & (v > 0)).float().mean())}


ECHO_PROMPTS = ("<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n",
                "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
                "The capital of France is")


@torch.inference_mode()
def echo_consistency(tokens: int = 24) -> None:
    """Mean |logprob while generating - logprob when echo-scoring the same output| (what kvqual's
    echo trust check measures), single stream: echo in one pass over prompt + output (its scale
    calibrated on both, as the server does), and one pass with the scale frozen at the prompt's."""
    from kvqual.serve.model import load_model, resolve_source

    torch.set_flush_denormal(True)
    loaded = load_model(resolve_source(None))
    decoder, head = loaded.model.get_decoder(), loaded.model.get_output_embeddings()

    def forward(cache, ids, start):
        x = torch.tensor([ids])
        out = decoder(input_ids=x, position_ids=torch.arange(start, start + len(ids)).unsqueeze(0),
                      attention_mask=torch.ones((1, start + len(ids)), dtype=torch.long), cache=cache, use_cache=True)
        return head(out.last_hidden_state[0]).float().log_softmax(-1)

    for fault in ("none", "ignore-scale-on-read"):
        one_pass, frozen = [], []
        for text in ECHO_PROMPTS:
            prompt = loaded.tokenizer(text, add_special_tokens=False).input_ids
            cache = KvCache(loaded.num_layers, "fp8_e4m3", "dynamic", fault)
            lp = forward(cache, prompt, 0)[-1]
            out, gen = [], []
            for _ in range(tokens):
                t = int(lp.argmax())
                out.append(t)
                gen.append(float(lp[t]))
                lp = forward(cache, [t], len(prompt) + len(out) - 1)[-1]
            echo = forward(KvCache(loaded.num_layers, "fp8_e4m3", "dynamic", fault), prompt + out, 0)
            one_pass += [abs(g - float(echo[len(prompt) - 1 + i, t])) for i, (g, t) in enumerate(zip(gen, out))]
            c2 = KvCache(loaded.num_layers, "fp8_e4m3", "dynamic", fault)
            scored = torch.cat([forward(c2, prompt, 0)[-1:], forward(c2, out[:-1], len(prompt))])
            frozen += [abs(g - float(scored[i, t])) for i, (g, t) in enumerate(zip(gen, out))]
        print(f"fp8_e4m3 kv_fault={fault}: generation vs echo mean |dlogprob| {sum(one_pass) / len(one_pass):.3f} "
              f"nats (one pass), {sum(frozen) / len(frozen):.3f} (scale frozen at the prompt's)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-suite", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--echo-consistency", action="store_true",
                        help="only measure generation vs echo logprobs (3 prompts x 24 tokens)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.echo_consistency:
        echo_consistency()
        return
    specs = [f"builtin:{s}@{args.per_suite}" for s in SUITES]
    items = [it for suite in load_suites(specs, seed=args.seed, limit=None) for it in suite.items]
    figures: dict[str, dict] = {}
    outputs: dict[str, list[Generation]] = {}
    loaded = None
    for name, dtype, fault in CONFIGS:
        t0 = time.monotonic()
        state = build_state(None, dtype, "dynamic", 32, None, kv_fault=fault)
        loaded = state.loaded
        prompts = [prompt_ids(state, it) for it in items]
        gens = generate_all(state, prompts, [it.max_tokens or args.max_tokens for it in items])
        state.engine.shutdown()
        outputs[name] = gens
        texts = [state.decode_output(g.output_ids) if not g.text else g.text for g in gens]
        base = outputs["bf16"]
        figures[name] = {
            "accuracy": sum(score(it, t) for it, t in zip(items, texts)) / len(items),
            "exact_vs_bf16": sum(g.output_ids == b.output_ids for g, b in zip(gens, base)) / len(items),
            "mean_output_tokens": sum(len(g.output_ids) for g in gens) / len(items),
            "hit_max_tokens": sum(g.finish_reason == "length" for g in gens) / len(items),
            "seconds": round(time.monotonic() - t0, 1),
            "sample": texts[0][:120],
        }
        print(name, json.dumps(figures[name]), flush=True)
    assert loaded is not None
    # teacher forcing: bf16's completions scored through each config's cache
    kl = {name: [] for name, _, _ in CONFIGS}
    top1 = {name: [] for name, _, _ in CONFIGS}
    ref_lp = {}
    for i, (it, g) in enumerate(zip(items, outputs["bf16"])):
        if not g.output_ids:
            continue
        ids = list(g.prompt_ids) + list(g.output_ids)
        for name, dtype, fault in CONFIGS:
            lp = teacher_logprobs(loaded, dtype, fault, ids, len(g.prompt_ids))
            if name == "bf16":
                ref_lp[i] = lp
            p = ref_lp[i]
            kl[name].extend((p.exp() * (p - lp)).sum(-1).clamp(min=0).tolist())
            top1[name].extend((p.argmax(-1) == lp.argmax(-1)).float().tolist())
    for name, _, _ in CONFIGS:
        figures[name]["teacher_forced_tokens"] = len(kl[name])
        figures[name]["mean_kl_nats"] = sum(kl[name]) / len(kl[name])
        figures[name]["same_top1"] = sum(top1[name]) / len(top1[name])
    firsts = [outputs["bf16"][i] for i in range(0, len(items), args.per_suite)]  # one item per suite
    figures["kv_range_at_scale_1"] = range_at_scale_one(
        loaded, [list(g.prompt_ids) + list(g.output_ids) for g in firsts])
    figures["items"] = {"n": len(items), "specs": specs, "seed": args.seed}
    print(json.dumps(figures, indent=1))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
