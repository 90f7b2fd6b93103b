"""A small fake SGLang server (aiohttp, no model) that speaks SGLang's own request/response shapes.

Run as a process: `python tests/fakesglang.py --port P [--kv-cache-dtype fp8_e4m3] [--logprob-noise S]
[--enable-metrics] [--max-total-num-tokens N]`. Every shape follows sgl-project/sglang's source (read
2026; the file named at each handler), nothing more; where versions differ the newest is followed:

- native `POST /generate` (entrypoints/http_server.py; request managers/io_struct.py GenerateReqInput;
  response managers/tokenizer_manager.py `_handle_batch_output` / `add_logprob_to_meta_info`);
- `GET /get_server_info` (and its 2026 name `/server_info`): the server args, then the scheduler's
  `status`, `max_total_num_tokens`, `max_req_input_len` at the top level, then `internal_states` (one per
  DP rank: the args again, `last_gen_throughput`, `memory_usage.token_capacity`), then `version`, as in
  the executed docs/basic_usage/native_api page (March 2026);
- `GET|POST /flush_cache` (plain-text answer, 400 while requests run), `GET /health`, `GET /v1/models`;
- `GET /metrics` only with `--enable-metrics` (metrics/collector.py names; scheduler gauges labelled
  model_name/engine_type/tp_rank/pp_rank as in managers/scheduler_metrics_mixin.py, tokenizer
  counters and histograms labelled model_name; labels sorted as prometheus_client's multiprocess
  collector writes them);
- `POST /v1/completions`, `/v1/chat/completions` (entrypoints/openai/serving_completions.py,
  serving_chat.py, protocol.py): logprob tokens are text, completions' `text_offset` is -1, echo puts
  the prompt's logprobs first (the first None); `return_token_ids` adds `token_ids` (the generated ids)
  and `prompt_token_ids` to each choice; chat also takes `return_prompt_token_ids`, `return_meta_info`;
- `POST /v1/tokenize` (alias `/tokenize`): exactly one of `prompt` or `messages` (protocol.py
  TokenizeRequest, extra fields allowed); `messages` render through the chat path, generation prompt
  added; answer `{tokens, count, max_model_len}`.

The model is a toy: pieces (`\\s*\\S+`) get ids from a hash table, `<s>`/`</s>` are 1/2; the next-token
distribution is a hash of the last 6 ids, so scoring a sequence in one prefill gives exactly the
logprobs reported while generating it. `--logprob-noise S` shifts every logprob by a seeded amount (a
candidate whose distributions drift). `--cache-noise S` shifts only the logprobs computed by a query that
read K/V back from the cache, as an fp8 KV cache does on the real server: every decode step after the
first, and a prefill whose prefix matched the radix cache; a prefill that matched nothing attends to the
K/V it has just computed and sees no drift (so one-prefill scoring of a completion is blind to it, as SGLang
0.5.17's is with its triton backend, docs/gpu.md); `--attention-backend fa3` reads every K/V from the cache, the
prefill's own too, as SGLang's FA3 backend does, so there one prefill drifts as well. The KV dtype is only
reported. Not offered: streaming, batches of more than one prompt on the OpenAI endpoints, stop strings, tools.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import re
import time
import uuid
from typing import Any

from aiohttp import web

PIECE = re.compile(r"\s*\S+")
PAD, BOS, EOS = 0, 1, 2
SPECIAL = {"<pad>": PAD, "<s>": BOS, "</s>": EOS}
VOCAB_SIZE = 50_100
POOL = [f" {w}" for w in ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi "
                          "omicron pi rho sigma tau upsilon").split()]
WINDOW = 6  # the toy model sees the last WINDOW ids


def _h(*parts: Any) -> float:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big") / 2**64


class ToyTokenizer:
    """Whitespace pieces ↔ ids by a hash table; `encode` remembers pieces so `decode` can invert."""

    def __init__(self) -> None:
        self.pieces: dict[int, str] = {i: s for s, i in SPECIAL.items()}
        for word in POOL:
            self.encode(word, add_special_tokens=False)

    def piece_id(self, piece: str) -> int:
        if piece in SPECIAL:
            return SPECIAL[piece]
        tid = 100 + int.from_bytes(hashlib.sha256(piece.encode()).digest()[:4], "big") % (VOCAB_SIZE - 100)
        self.pieces.setdefault(tid, piece)
        return tid

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [self.piece_id(p) for p in PIECE.findall(text)]
        return [BOS, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces.get(i, f"<unk{i}>") for i in ids
                       if not (skip_special_tokens and i in SPECIAL.values()))

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """A fixed chat template, generation prompt added; encoded without special tokens (the
        template writes `<s>` itself), as serving_chat.py `_apply_jinja_template` does."""
        text = "<s>" + "".join(f" <|{m.get('role')}|> {m.get('content') or ''} <|end|>" for m in messages)
        return self.encode(text + " <|assistant|>", add_special_tokens=False)


class ToyModel:
    def __init__(self, tok: ToyTokenizer, noise: float) -> None:
        self.pool = [tok.piece_id(w) for w in POOL]
        self.noise = noise

    def logprobs(self, context: list[int], kv: float = 0.0) -> dict[int, float]:
        """The candidates at the next position (8 pool words and EOS) with their logprobs; any other
        id gets `other_logprob`. EOS can lead only after two pool words, so answers are not empty.
        `kv`: the drift of K/V read back from the cache (0: none read)."""
        key = tuple(context[-WINDOW:])
        cands = list(dict.fromkeys(self.pool[int(_h(key, j) * len(self.pool))] for j in range(8)))
        scores = {t: 3.0 * _h(key, "s", t) for t in cands}
        two_words = len(key) >= 2 and key[-1] in self.pool and key[-2] in self.pool
        scores[EOS] = 4.0 if two_words and _h(key, "stop") < 0.3 else -2.0
        norm = math.log(sum(math.exp(s) for s in scores.values()))
        return {t: s - norm - self.noise * _h("noise", key, t) - kv * _h("kv", key, t) for t, s in scores.items()}

    def logprob(self, context: list[int], token: int, kv: float = 0.0) -> float:
        lps = self.logprobs(context, kv)
        if token in lps:
            return lps[token]
        key = tuple(context[-WINDOW:])
        return -12.0 - 3.0 * _h(key, "other", token) - self.noise * _h("noise", key, token) - kv * _h("kv", key, token)

    def top(self, context: list[int], k: int, kv: float = 0.0) -> list[tuple[float, int]]:
        return sorted(((lp, t) for t, lp in self.logprobs(context, kv).items()), reverse=True)[:k]


class RadixCache:
    """The radix cache as a token trie: every finished request's input + output ids are inserted, and a
    request's prefix match is the longest cached path, capped at `limit` (schedule_batch.py
    `_compute_max_prefix_len`)."""

    def __init__(self) -> None:
        self.root: dict[int, dict] = {}

    def match(self, ids: list[int], limit: int) -> int:
        node, n = self.root, 0
        for t in ids[:max(0, limit)]:
            nxt = node.get(t)
            if nxt is None:
                break
            node, n = nxt, n + 1
        return n

    def insert(self, ids: list[int]) -> None:
        node = self.root
        for t in ids:
            node = node.setdefault(t, {})

    def clear(self) -> None:
        self.root = {}


class Engine:
    """What TokenizerManager + Scheduler do for one request, plus the counters /metrics reports."""

    TTFT_S, ITL_S = 0.01, 0.002  # the fake's latencies, recorded in the histograms

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tok = ToyTokenizer()
        self.model = ToyModel(self.tok, args.logprob_noise)
        self.cache = RadixCache()
        self.running = 0
        self.totals = {"prompt": 0, "generation": 0, "cached": 0, "requests": 0, "itl_tokens": 0}
        self.last_gen_throughput = 0.0
        self.cache_hit_rate = 0.0

    def _entries(self, vals: list[tuple[float | None, int]], text: bool) -> list[list[Any]]:
        """tokenizer_manager.py detokenize_logprob_tokens: [logprob, token_id, text or None]."""
        return [[lp, tid, self.tok.decode([tid]) if text else None] for lp, tid in vals]

    def generate(self, ids: list[int], sp: dict[str, Any], return_logprob: bool, start: int, k: int,
                 text_in_logprobs: bool, return_prompt_token_ids: bool = False) -> dict[str, Any]:
        """One native /generate result dict: {text, output_ids, meta_info[, prompt_token_ids]}."""
        if not ids:
            raise ValueError("The input_ids cannot be empty.")
        if return_logprob and start >= len(ids):
            raise ValueError(f"logprob_start_len ({start}) is larger than the input length ({len(ids)}).")
        limit = self.args.context_length - len(ids) - 1
        max_new = min(limit if sp.get("max_new_tokens") is None else int(sp["max_new_tokens"]), limit)
        if max_new < 0:
            raise ValueError("max_new_tokens must be at least 0.")
        temperature = 1.0 if sp.get("temperature") is None else float(sp["temperature"])
        rng = random.Random(f"{sp.get('sampling_seed')}|{ids}")
        # SGLang limits the prefix match to logprob_start_len so the prompt's logprobs are computed
        cached = self.cache.match(ids, min(len(ids) - 1, start if return_logprob and start >= 0 else len(ids)))
        # the prefill's queries read the matched prefix's K/V; with FA3 they read every K/V from the cache, the
        # new tokens' too (stored first), so a prefill that matched nothing drifts as well
        read = self.args.cache_noise if cached or self.args.attention_backend == "fa3" else 0.0
        output: list[int] = []
        out_lp: list[tuple[float | None, int]] = []
        out_top: list[list[tuple[float, int]]] = []
        finish: dict[str, Any] = {"type": "length", "length": max_new}
        for step in range(max_new):
            kv = read if step == 0 else self.args.cache_noise  # a decode step reads every K/V from the cache
            lps = self.model.logprobs(ids + output, kv)
            if temperature < 1e-6:  # SamplingParams: temperature 0 is greedy (top_k = 1)
                token = max(lps, key=lps.__getitem__)
            else:
                weights = [math.exp(lp / temperature) for lp in lps.values()]
                token = rng.choices(list(lps), weights)[0]
            out_lp.append((lps[token], token))
            out_top.append(self.model.top(ids + output, k, kv))
            output.append(token)
            if token == EOS and not sp.get("ignore_eos"):
                finish = {"type": "stop", "matched": EOS}  # schedule_batch.py FINISH_MATCHED_TOKEN.to_json
                break
        if not self.args.disable_radix_cache:
            self.cache.insert(ids + output)
        self._account(len(ids), len(output), cached)
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": len(ids),
            "weight_version": "default", "total_retractions": 0, "completion_tokens": len(output),
            "cached_tokens": cached, "cached_tokens_details": None, "dp_rank": None,
            "e2e_latency": self.TTFT_S + self.ITL_S * max(0, len(output) - 1),
            "response_sent_to_client_ts": time.time(),
        }
        if return_logprob:
            # scheduler_output_processor_mixin.py: positions logprob_start_len.. of the prompt, the first
            # None (`[None] + input_token_logprobs[:-1]`), whatever logprob_start_len is; -1: none
            span = range(start, len(ids)) if start >= 0 else range(0)
            meta["input_token_logprobs"] = self._entries(
                [(None if p == start else self.model.logprob(ids[:p], ids[p], read), ids[p]) for p in span],
                text_in_logprobs)
            meta["output_token_logprobs"] = self._entries(out_lp, text_in_logprobs)
            meta["output_token_logprobs_length"] = len(out_lp)
            if k > 0:
                meta["input_top_logprobs"] = [None if p == start else
                                              self._entries(self.model.top(ids[:p], k, read), text_in_logprobs)
                                              for p in span]
                meta["output_top_logprobs"] = [self._entries(t, text_in_logprobs) for t in out_top]
        out = {"text": self.tok.decode(output, skip_special_tokens=True), "output_ids": output, "meta_info": meta}
        if return_prompt_token_ids:
            out["prompt_token_ids"] = list(ids)
        return out

    def _account(self, prompt: int, generated: int, cached: int) -> None:
        t = self.totals
        t["prompt"] += prompt
        t["generation"] += generated
        t["cached"] += cached
        t["requests"] += 1
        t["itl_tokens"] += max(0, generated - 1)
        self.cache_hit_rate = cached / prompt if prompt else 0.0
        self.last_gen_throughput = generated / (self.TTFT_S + self.ITL_S * max(0, generated - 1))

    # ---------------------------------------------------------------- /metrics

    def metrics_text(self) -> str:
        model = self.args.served_model_name
        sched = {"engine_type": "unified", "model_name": model, "pp_rank": "0", "tp_rank": "0"}
        tokzr = {"model_name": model}
        lines: list[str] = []

        def series(name: str, kind: str, labels: dict[str, str], value: float, doc: str) -> None:
            lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}"])
            lines.append(f"{name}{_labels(labels)} {float(value)!r}")

        def histogram(name: str, count: int, total: float, each: float, doc: str) -> None:
            lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} histogram"])
            for le in ("0.001", "0.01", "0.1", "1.0", "+Inf"):
                below = count if le == "+Inf" or each <= float(le) else 0
                lines.append(f"{name}_bucket{_labels({'le': le, **tokzr})} {float(below)!r}")
            lines.append(f"{name}_count{_labels(tokzr)} {float(count)!r}")
            lines.append(f"{name}_sum{_labels(tokzr)} {float(total)!r}")

        t, cap = self.totals, self.args.max_total_num_tokens
        series("sglang:num_running_reqs", "gauge", sched, self.running, "The number of running requests.")
        series("sglang:num_used_tokens", "gauge", sched, 0, "The number of used tokens.")
        series("sglang:token_usage", "gauge", sched, 0.0, "The token usage.")
        series("sglang:gen_throughput", "gauge", sched, self.last_gen_throughput,
               "The generation throughput (token/s).")
        series("sglang:num_queue_reqs", "gauge", sched, 0, "The number of requests in the waiting queue.")
        series("sglang:cache_hit_rate", "gauge", sched, self.cache_hit_rate, "The prefix cache hit rate.")
        series("sglang:max_total_num_tokens", "gauge", sched, cap,
               "Maximum total number of tokens in the KV cache pool.")
        series("sglang:prompt_tokens_total", "counter", tokzr, t["prompt"], "Number of prefill tokens processed.")
        series("sglang:generation_tokens_total", "counter", tokzr, t["generation"],
               "Number of generation tokens processed.")
        series("sglang:cached_tokens_total", "counter", tokzr, t["cached"], "Number of cached prompt tokens.")
        series("sglang:num_requests_total", "counter", tokzr, t["requests"], "Number of requests processed.")
        histogram("sglang:time_to_first_token_seconds", t["requests"], self.TTFT_S * t["requests"], self.TTFT_S,
                  "Histogram of time to first token in seconds.")
        # collector.py observe_inter_token_latency: _sum in seconds, the buckets (so _count) in tokens
        histogram("sglang:inter_token_latency_seconds", t["itl_tokens"], self.ITL_S * t["itl_tokens"],
                  self.ITL_S, "Histogram of inter-token latency in seconds.")
        return "\n".join(lines) + "\n"


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _error(message: str, status: int = 400) -> web.Response:
    """http_server.py's handlers: ErrorResponse (protocol.py) for the OpenAI routes and validation."""
    return web.json_response({"object": "error", "message": message, "type": "Bad Request", "param": None,
                              "code": status}, status=status)


class Fake:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.engine = Engine(args)
        self.started = int(time.time())

    # ---------------------------------------------------------------- native API

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("stream"):
            return _error("this fake does not stream")
        prompts = body.get("input_ids") if body.get("input_ids") is not None else body.get("text")
        batch = isinstance(prompts, list) and bool(prompts) and isinstance(prompts[0], (str, list))
        outs = []
        try:
            if prompts is None:
                raise ValueError("Either text, input_ids or input_embeds should be provided.")
            for prompt in (prompts if batch else [prompts]):
                ids = self.engine.tok.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
                start = body.get("logprob_start_len")
                outs.append(self.engine.generate(
                    ids, dict(body.get("sampling_params") or {}), bool(body.get("return_logprob")),
                    -1 if start is None else int(start), int(body.get("top_logprobs_num") or 0),
                    bool(body.get("return_text_in_logprobs")), bool(body.get("return_prompt_token_ids"))))
        except ValueError as exc:  # http_server.py _create_error_response
            return web.json_response({"error": {"message": str(exc)}}, status=400)
        return web.json_response(outs if batch else outs[0])

    def _server_args(self) -> dict[str, Any]:
        a = self.args
        return {"model_path": a.model, "tokenizer_path": a.model, "skip_tokenizer_init": False, "host": "127.0.0.1",
                "port": a.port, "dtype": a.dtype, "quantization": None, "kv_cache_dtype": a.kv_cache_dtype,
                "mem_fraction_static": a.mem_fraction_static, "max_running_requests": 128, "max_total_tokens": None,
                "chunked_prefill_size": 8192, "max_prefill_tokens": 16384, "schedule_policy": "fcfs",
                "page_size": 1, "context_length": a.context_length, "device": "cuda", "tp_size": 1, "pp_size": 1,
                "dp_size": 1, "random_seed": 0, "enable_metrics": a.enable_metrics,
                "enable_cache_report": a.enable_cache_report,
                "served_model_name": a.served_model_name, "weight_version": "default", "chat_template": None,
                "disable_radix_cache": a.disable_radix_cache, "attention_backend": a.attention_backend,
                "speculative_algorithm": None}

    async def server_info(self, request: web.Request) -> web.Response:
        """http_server.py get_server_info: {**server_args, **scheduler_info, internal_states, version}."""
        cap = self.args.max_total_num_tokens
        internal = {**self._server_args(), "last_gen_throughput": self.engine.last_gen_throughput,
                    "memory_usage": {"weight": 0.98, "kvcache": 0.23, "token_capacity": cap, "graph": 0.06},
                    "effective_max_running_requests_per_dp": 128}
        return web.json_response({**self._server_args(), "status": "ready", "max_total_num_tokens": cap,
                                  "max_req_input_len": min(cap, self.args.context_length) - 1,
                                  "internal_states": [internal], "version": "0.0.0.fake"})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.args.model, "tokenizer_path": self.args.model,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": "default", "has_image_understanding": False,
                                  "has_audio_understanding": False, "model_type": "toy",
                                  "architectures": ["ToyForCausalLM"]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.engine.running:
            return web.Response(status=400, text="Cache not flushed: requests are running.\n")
        self.engine.cache.clear()
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.engine.metrics_text(), content_type="text/plain")

    # ---------------------------------------------------------------- OpenAI-compatible API

    async def models(self, request: web.Request) -> web.Response:
        name = self.args.served_model_name
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": self.started, "owned_by": "sglang", "root": name,
             "parent": None, "max_model_len": self.args.context_length}]})

    def _chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        messages = [dict(m) for m in messages]
        if messages and messages[-1].get("role") == "assistant":  # _handle_last_assistant_message
            messages[-1]["role"] = "user"
        return self.engine.tok.chat(messages)

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        if (body.get("prompt") is None) == (body.get("messages") is None):
            return _error("Exactly one of 'prompt' or 'messages' must be provided.")
        tok = self.engine.tok
        if body.get("messages") is not None:
            tokens: Any = self._chat_ids(body["messages"])
            count: Any = len(tokens)
        else:
            add = body.get("add_special_tokens", True)
            prompt = body["prompt"]
            tokens = tok.encode(prompt, add) if isinstance(prompt, str) else [tok.encode(p, add) for p in prompt]
            count = len(tokens) if isinstance(prompt, str) else [len(t) for t in tokens]
        return web.json_response({"tokens": tokens, "count": count, "max_model_len": self.args.context_length})

    def _openai_logprobs(self, entries: list[list[Any]], tops: list[Any] | None) -> dict[str, Any]:
        """utils.py to_openai_style_logprobs: text tokens, text_offset -1 ("not supported yet")."""
        return {"text_offset": [-1] * len(entries), "token_logprobs": [e[0] for e in entries],
                "tokens": [e[2] for e in entries],
                "top_logprobs": [None if t is None else {e[2]: e[0] for e in t} for t in tops or []]}

    def _usage(self, out: dict[str, Any]) -> dict[str, Any]:
        """As UsageProcessor.calculate_response_usage: with --enable-cache-report the prompt's cached tokens, and
        only where there are some (`_details_if_cached`: "keeps JSON slim"), else None."""
        m = out["meta_info"]
        cached = m["cached_tokens"] if self.args.enable_cache_report else 0
        return {"prompt_tokens": m["prompt_tokens"], "total_tokens": m["prompt_tokens"] + m["completion_tokens"],
                "completion_tokens": m["completion_tokens"],
                "prompt_tokens_details": {"cached_tokens": cached} if cached > 0 else None, "reasoning_tokens": 0}

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("stream"):
            return _error("this fake does not stream")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                return _error("this fake takes one prompt")
            prompt = prompt[0]
        if not prompt:
            return _error("Prompt cannot be empty")
        max_tokens = body.get("max_tokens", 16)
        if max_tokens is not None and max_tokens <= 0:
            return _error("max_tokens must be positive")
        logprobs, echo = body.get("logprobs"), bool(body.get("echo"))
        ids = self.engine.tok.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        sp = {"max_new_tokens": max_tokens, "temperature": body.get("temperature", 1.0),
              "sampling_seed": body.get("seed"), "ignore_eos": body.get("ignore_eos", False)}
        try:
            out = self.engine.generate(ids, sp, logprobs is not None, 0 if echo and logprobs else -1,
                                       logprobs or 0, True, bool(body.get("return_token_ids")))
        except ValueError as exc:
            return _error(str(exc))
        m = out["meta_info"]
        text = out["text"]
        if echo:
            text = (prompt if isinstance(prompt, str) else self.engine.tok.decode(ids, True)) + text
        lp = None
        if logprobs is not None:
            entries = (m["input_token_logprobs"] if echo else []) + m["output_token_logprobs"]
            tops = ((m.get("input_top_logprobs") or []) if echo else []) + (m.get("output_top_logprobs") or [])
            lp = self._openai_logprobs(entries, tops)
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": lp, "finish_reason": m["finish_reason"]["type"],
                                  "matched_stop": m["finish_reason"].get("matched")}
        if body.get("return_token_ids"):
            choice.update(token_ids=out["output_ids"], prompt_token_ids=out["prompt_token_ids"])
        return web.json_response({"id": m["id"], "object": "text_completion", "created": int(time.time()),
                                  "model": body.get("model", "default"), "choices": [choice],
                                  "usage": self._usage(out), "metadata": {"weight_version": "default"}})

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("stream"):
            return _error("this fake does not stream")
        ids = list(body["input_ids"]) if body.get("input_ids") is not None else self._chat_ids(body["messages"])
        k = int(body.get("top_logprobs") or 0)
        want_ids = bool(body.get("return_token_ids"))
        sp = {"max_new_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
              "temperature": body.get("temperature"), "sampling_seed": body.get("seed"),
              "ignore_eos": body.get("ignore_eos", False)}
        try:
            out = self.engine.generate(ids, sp, bool(body.get("logprobs")), -1, k, True,
                                       want_ids or bool(body.get("return_prompt_token_ids")))
        except ValueError as exc:
            return _error(str(exc))
        m = out["meta_info"]
        lp = None
        if body.get("logprobs"):  # serving_chat.py _process_logprobs_tokens
            tops = m.get("output_top_logprobs") or []
            lp = {"content": [
                {"token": e[2], "bytes": list(e[2].encode()), "logprob": e[0],
                 "top_logprobs": [{"token": t[2], "bytes": list(t[2].encode()), "logprob": t[0]}
                                  for t in (tops[i] if tops else [])]}
                for i, e in enumerate(m["output_token_logprobs"])]}
        choice: dict[str, Any] = {
            "index": 0, "message": {"role": "assistant", "content": out["text"], "reasoning_content": None,
                                    "tool_calls": None},
            "logprobs": lp, "finish_reason": m["finish_reason"]["type"],
            "matched_stop": m["finish_reason"].get("matched")}
        if want_ids or body.get("return_prompt_token_ids"):
            choice["prompt_token_ids"] = out["prompt_token_ids"]
        if want_ids:
            choice["token_ids"] = out["output_ids"]
        if body.get("return_meta_info"):
            choice["meta_info"] = m
        return web.json_response({"id": m["id"], "object": "chat.completion", "created": int(time.time()),
                                  "model": body.get("model", "default"), "choices": [choice],
                                  "usage": self._usage(out), "metadata": {"weight_version": "default"}})


def make_app(args: argparse.Namespace) -> web.Application:
    fake = Fake(args)

    generating = {"/generate", "/v1/completions", "/v1/chat/completions"}

    @web.middleware
    async def running(request: web.Request, handler):  # what sglang:num_running_reqs counts
        if request.path not in generating:
            return await handler(request)
        fake.engine.running += 1
        try:
            return await handler(request)
        finally:
            fake.engine.running -= 1

    app = web.Application(middlewares=[running])
    app.add_routes([
        web.post("/generate", fake.generate), web.put("/generate", fake.generate),
        web.get("/get_server_info", fake.server_info), web.get("/server_info", fake.server_info),
        web.get("/get_model_info", fake.model_info), web.get("/model_info", fake.model_info),
        web.get("/flush_cache", fake.flush_cache), web.post("/flush_cache", fake.flush_cache),
        web.get("/health", fake.health), web.get("/health_generate", fake.health),
        web.get("/v1/models", fake.models), web.post("/v1/tokenize", fake.tokenize),
        web.post("/tokenize", fake.tokenize), web.post("/v1/completions", fake.completions),
        web.post("/v1/chat/completions", fake.chat)])
    if args.enable_metrics:  # SGLang serves /metrics only with --enable-metrics
        app.add_routes([web.get("/metrics", fake.metrics)])
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="fake-org/toy-sglang-model")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--dtype", default="auto", help="the model dtype (\"auto\": the checkpoint's), as SGLang reports it")
    p.add_argument("--mem-fraction-static", type=float, default=0.836)
    p.add_argument("--max-total-num-tokens", type=int, default=20480)
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--logprob-noise", type=float, default=0.0)
    p.add_argument("--disable-radix-cache", action="store_true", help="cache nothing: every prefix is recomputed")
    p.add_argument("--cache-noise", type=float, default=0.0, help="drift of K/V read back from the cache")
    p.add_argument("--attention-backend", default="triton", choices=("triton", "fa3"),
                   help="triton: a prefill attends to the K/V it has just computed; fa3: to every K/V from the cache")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true", help="cached prompt tokens in every answer's usage")
    args = p.parse_args(argv)
    args.served_model_name = args.served_model_name or args.model
    return args


if __name__ == "__main__":
    args = parse_args()
    web.run_app(make_app(args), host="127.0.0.1", port=args.port, print=None, access_log=None)
