"""The `kvqual load` flow: each target in turn is launched (when it has `launch`), probed, driven
at one concurrency for the same duration, and stopped; then the figures are written and the
ratio taken. The concurrency is fixed before the first target runs and kept for the second, so
both arms get the same offered load.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvqual.config import Target
from kvqual.errors import InfrastructureError
from kvqual.load import summary
from kvqual.load.drive import Driven
from kvqual.records import GenerationParams, Item
from kvqual.suites import LoadedSuite

DEFAULT_SUITE = "instruct"  # built-in chat prompts; pass your own with --suite for realistic lengths
DEFAULT_DURATION_S = 180.0
UNKNOWN_CAPACITY_CONCURRENCY = 64
OVERSUBSCRIBE = 3  # the default load: 3 × the requests the first target's KV cache holds
MAX_DEFAULT_CONCURRENCY = 1024
CHAT_TEMPLATE_TOKENS = 8  # per message: role markers of a chat template, roughly


@dataclass(frozen=True)
class LoadOptions:
    duration_s: float = DEFAULT_DURATION_S
    concurrency: int | None = None  # None: derived from the first target's KV capacity
    warmup_s: float | None = None  # None: the documented rule
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 1234
    timeout_s: float = 600.0
    max_failed_rate: float = 0.05
    results_dir: str = "results"
    level: float = 0.95
    progress: bool = True


def expected_prompt_tokens(item: Item) -> float:
    """An item's prompt length in tokens, before any server has tokenized it: token-id prompts
    exactly, text at ~4 characters a token (suites/generated.CHARS_PER_TOKEN), chat messages the
    same plus a few tokens a message for the template."""
    from kvqual.suites.generated import CHARS_PER_TOKEN

    if isinstance(item.prompt, tuple):
        return float(len(item.prompt))
    if item.prompt is not None:
        return len(item.prompt) / CHARS_PER_TOKEN
    messages = item.messages or ()
    return sum(len(str(m.get("content") or "")) / CHARS_PER_TOKEN + CHAT_TEMPLATE_TOKENS for m in messages)


def default_concurrency(capacity_tokens: int | None, items: tuple[Item, ...], max_tokens: int) -> tuple[int, str]:
    """(concurrency, how it was chosen): OVERSUBSCRIBE × the requests that fit in the KV capacity
    when each holds its prompt plus max_tokens (what a server that reserves the whole output
    admits: kvqual serve; vLLM and SGLang admit more while outputs are short), else 64."""
    if not capacity_tokens or not items:
        return UNKNOWN_CAPACITY_CONCURRENCY, (f"default {UNKNOWN_CAPACITY_CONCURRENCY}: the server reports no KV "
                                              "capacity")
    per_request = sum(expected_prompt_tokens(i) for i in items) / len(items) + max_tokens
    holds = max(1, math.floor(capacity_tokens / per_request))
    concurrency = min(MAX_DEFAULT_CONCURRENCY, OVERSUBSCRIBE * holds)
    return concurrency, (f"{OVERSUBSCRIBE} × the {holds} requests its KV cache holds ({capacity_tokens:,} tokens / "
                         f"~{per_request:.0f} tokens a request: prompt ≈ chars/4 + max_tokens {max_tokens})")


def _model_of(target: Target, info: dict[str, Any]) -> str:
    if target.model is not None:
        if info["models"] and target.model not in info["models"]:
            raise InfrastructureError(f"{target.name}: model {target.model!r} is not served at {target.base_url} "
                                      f"(served: {', '.join(info['models'])})")
        return target.model
    if not info["models"]:
        raise InfrastructureError(f"{target.base_url}/models lists no model; set `model` for target {target.name}")
    return info["models"][0]


@dataclass(frozen=True)
class LoadResult:
    folder: Path
    doc: dict[str, Any]
    failure: str | None = None  # a target failed beyond max_failed_rate: the CLI's exit 4


async def run_load(targets: list[Target], suites: tuple[LoadedSuite, ...], opts: LoadOptions,
                   command: str = "") -> LoadResult:
    """Drive each target in turn; load.json is rewritten after each one, so a stop keeps what was
    measured. A target whose failed share exceeds `max_failed_rate` (or that answered nothing)
    ends the load there, with `failure` saying why."""
    from kvqual import __version__, probe
    from kvqual.launch import serving
    from kvqual.load.drive import drive
    from kvqual.provenance import git_revision, package_versions

    items = tuple(i for s in suites for i in s.items)
    if not items:
        raise InfrastructureError("no prompts to send: the suites hold no items (lm-eval suites are not used by load)")
    folder = summary.new_results_dir(opts.results_dir, [t.name for t in targets])
    params = GenerationParams(temperature=opts.temperature, top_p=opts.top_p, seed=opts.seed,
                              max_tokens=opts.max_tokens, top_logprobs=0, repeats=1, stream=True)
    provenance = {"command": command, "started_at": time.time(), "kvqual_version": __version__,
                  "git_revision": git_revision(), "packages": package_versions()}
    concurrency, source = opts.concurrency, "--concurrency"
    arms: list[dict[str, Any]] = []
    recorded: dict[str, Any] = {}

    def params_json() -> dict[str, Any]:
        return {"duration_s": opts.duration_s, "warmup_s": opts.warmup_s, "concurrency": concurrency,
                "concurrency_source": source, "max_tokens": opts.max_tokens, "temperature": opts.temperature,
                "top_p": opts.top_p, "seed": opts.seed, "timeout_s": opts.timeout_s, "stream": True,
                "suites": [[s.ref.name, s.ref.sha256] for s in suites], "items": len(items),
                "max_failed_rate": opts.max_failed_rate, "level": opts.level}

    for target in targets:
        async with serving(target, opts.results_dir) as ready:
            info = await probe.describe(ready.base_url, ready.api_key(), timeout=probe.probe_timeout(opts.timeout_s),
                                        patience=opts.timeout_s)
            info["base_urls"] = list(ready.base_urls)
            model = _model_of(ready, info)
            if concurrency is None:
                concurrency, source = default_concurrency(info.get("kv_capacity_tokens"), items, opts.max_tokens)
                source = f"{source}, of {target.name}"
            info["prefix_cache_flushed"] = await probe.flush_cache(ready.base_url, ready.api_key(),
                                                                   probe.probe_timeout(opts.timeout_s))
            driven: Driven = await drive(ready, items, params, model, concurrency=concurrency,
                                         duration_s=opts.duration_s, timeout_s=opts.timeout_s,
                                         progress=opts.progress)
        arm = summary.summarize_arm(target.name, info, model, target.kv_cache_dtype, driven, concurrency, source,
                                    opts.warmup_s, opts.level, identity=target.identity())
        arms.append(arm)
        recorded[target.name if target.name not in recorded else f"{target.name}#{len(arms)}"] = driven.requests
        failed_rate = arm["requests"]["failed_rate"] or 0.0
        too_many = failed_rate > opts.max_failed_rate or not arm["requests"]["answered"]
        doc = summary.document(arms, params_json(), provenance, "failed" if too_many else
                               ("complete" if len(arms) == len(targets) else "partial"), opts.level)
        summary.write(folder, doc, recorded)
        if too_many:
            req = arm["requests"]
            top = next(iter(req["errors"]), "no answer")
            return LoadResult(folder, doc, (
                f"{target.name}: {req['failed']} of {req['sent']} requests failed under load ({failed_rate:.1%} > "
                f"max_failed_rate {opts.max_failed_rate:.1%}; most common: {top}); figures in {folder}/load.json"))
    return LoadResult(folder, doc)
