"""A small OpenAI-compatible server for tests and benchmarks (aiohttp, no model).

Run as a process: `python tests/fakeserver.py --port P [--wrong-rate R] [--length-factor F] ...`.
Answers are deterministic functions of the prompt, so tests can predict them:

- a prompt containing `[[answer=X]]` is answered `X` (or `wrong` for a hash-chosen share
  `--wrong-rate` of prompts); any other prompt is answered `ok <last word>`;
- `--length-factor F` repeats the answer's words F times (a "much longer" candidate);
- `--answer-tokens N` cycles the answer's words to exactly N tokens (a long answer of known size:
  the runner benchmark asks for 256 tokens at top-5, and gets them);
- prompts containing `flaky` fail with 503 on their first two attempts, `ratelimit` with 429
  and Retry-After on the first, `broken` always with 500, `badrequest` with 400;
- `--no-logprobs` silently drops logprobs (a server that breaks the contract);
- echo scoring (`echo: true, max_tokens: 0` or `1`, which appends one generated token) returns per-token logprobs (`--echo-shift`: one
  position late, a shipped echo bug); `--logprob-noise S`
  perturbs them by a seeded amount (a candidate whose token distributions drift);
- GET /stats returns how many requests each prompt received; `--delay S` sleeps per request;
  `--serial` answers one request at a time (the others wait, counted in `vllm:num_requests_waiting`).
- `stream: true` answers in Server-Sent Events, one chunk per token (`--token-delay S` apart),
  with a usage chunk when `stream_options.include_usage`; `--stream-error` breaks the stream
  with an error event after the first token.
- `--metrics` serves vLLM-named Prometheus counters at GET /metrics (tokens, running requests,
  a TTFT histogram) so server-side figures can be tested.
- `--echo-auth` repeats the request's Authorization header in every error body (a server that
  leaks the API key into its error messages).
- `--max-running N` is a server of fixed capacity: at most N requests generate at once, the rest
  queue (`vllm:num_requests_waiting`; KV usage is running / N); `--kv-capacity-tokens T` reports
  `max_total_num_tokens` T in /get_server_info (SGLang's and kvqual serve's KV capacity);
  `--burst-s S` admits every request during the first S seconds after the first /v1 one (an empty KV
  cache admits all before outputs grow: the warm-up burst a load test must discard);
  `--token-jitter F` draws each streamed token's delay from token-delay × [1 − F, 1 + F]
  (seeded by the prompt, so runs repeat), giving throughput a real variance.
- `--prefix-cache` is a prefix-caching server: a generation request's prompt tokens that earlier
  prompts of the same `cache_salt` namespace shared, in whole 16-token blocks (at least the last
  token computed), are reported as `usage.prompt_tokens_details.cached_tokens`; echo requests
  never read the cache but write it (vLLM v1). `--warm-noise S` perturbs the generated logprobs of a request
  that hit the cache by a seeded amount (a broken cache path: cold requests are untouched).
- `--token-ids` speaks vLLM's token ids with a character tokenizer (token id = the character's code
  point, so any two fakes agree): POST /tokenize (`prompt`, or `messages` rendered as the chat
  endpoint joins them), token-id prompts, `return_tokens_as_token_ids` (tokens and top-k keys as
  `token_id:N`). A position's logprob depends on the last 40 characters before it, so a scoring
  window that keeps 40+ characters of context scores exactly what the whole sequence does.
- `--broken-rate R --broken-noise S` breaks R of the prompts (by a hash of their text's first 60
  characters, alike in generation and echo scoring): their logprobs move by S/2 to S nats (an fp8 scale
  overflowing on a few prompts); `--nan-rate R` answers R of the prompts with a NaN logprob (NaN
  logits), in generation and in echo scoring alike;
- `--gpu-noise P --noise-seed K` is a GPU server's batch nondeterminism as vLLM on an H200 showed it:
  a share P of prompts (chosen by a hash of the prompt's start and K, so two servers with different K
  differ on different prompts, and a server agrees with itself) get every logprob moved by up to 0.01
  nats, generation and echo alike; the rest are bit-identical across servers.
- `--echo-noise S` moves every echo logprob by up to S nats, drawn anew for each request: a server whose
  teacher-forcing passes never reproduce one another (the A/A floor must be measured on every item).
- `--max-model-len N` reports `max_model_len` N in /v1/models and /tokenize and refuses a request whose
  prompt tokens + max_tokens exceed N with vLLM's HTTP 400 text ("This model's maximum context
  length is N tokens. However, you requested …"); `--hide-max-model-len` refuses the same but
  reports no limit (a server whose limit is only learnt from its refusal).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import random
import re
import time
from collections import Counter

from aiohttp import web

TOKEN = re.compile(r"\s*\S+")


def _h(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def tokenize(text: str) -> list[str]:
    return TOKEN.findall(text) or [text]


class Fake:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.counts: Counter[str] = Counter()
        self.prompt_tokens = self.generation_tokens = self.running = self.waiting = 0
        self.prefixes: dict[str, set[tuple[str, ...]]] = {}  # cache_salt → cached block prefixes
        self.ttft_sum, self.ttft_count = 0.0, 0

    BLOCK = 16

    def cached(self, body: dict, tokens: list[str]) -> int | None:
        """Prompt tokens served from the prefix cache (None: no prefix cache), then cache this prompt."""
        if not self.args.prefix_cache:
            return None
        seen = self.prefixes.setdefault(str(body.get("cache_salt")), set())
        hit = 0
        for end in range(self.BLOCK, len(tokens), self.BLOCK):  # whole blocks, the last token computed
            if tuple(tokens[:end]) not in seen:
                break
            hit = end
        seen.update(tuple(tokens[:end]) for end in range(self.BLOCK, len(tokens) + 1, self.BLOCK))
        return hit

    def account(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += completion_tokens
        self.ttft_sum += 0.01 + self.args.delay
        self.ttft_count += 1

    async def stream(self, request: web.Request, body: dict, choice: dict, prompt_tokens: int,
                     chat: bool) -> web.StreamResponse:
        """The same answer as Server-Sent Events, a chunk per token, as OpenAI/vLLM stream it."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"id": "cmpl-fake", "object": "chat.completion.chunk" if chat else "text_completion", "created": 0,
                "model": body.get("model", "fake")}

        async def send(obj: dict) -> None:
            await response.write(f"data: {json.dumps(obj)}\n\n".encode())

        if chat:
            text = choice["message"]["content"]
            content = (choice.get("logprobs") or {}).get("content")
            tokens = self.toks(text)
            await send({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]})
        else:
            lp = choice.get("logprobs")
            tokens = lp["tokens"] if lp else self.toks(choice["text"])
        jitter = random.Random(f"{body.get('seed')}:{choice.get('text') or ''}:{self.counts.total()}")
        for i, tok in enumerate(tokens):
            f = self.args.token_jitter
            await asyncio.sleep(self.args.token_delay * (jitter.uniform(1 - f, 1 + f) if f else 1.0))
            last = i == len(tokens) - 1
            if chat:
                part = {"index": 0, "delta": {"content": tok}, "finish_reason": choice["finish_reason"] if last else None,
                        "logprobs": {"content": content[i:i + 1]} if content else None}
            else:
                part = {"index": 0, "text": tok, "finish_reason": choice["finish_reason"] if last else None,
                        "logprobs": {k: v[i:i + 1] for k, v in lp.items()} if lp else None}
            await send({**base, "choices": [part]})
            if self.args.stream_error and i == 0:
                await send({"error": {"message": "engine died mid-stream", "type": "fake", "code": 500}})
                return response
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({**base, "choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                         "completion_tokens": len(tokens),
                                                         "total_tokens": prompt_tokens + len(tokens)}})
        await response.write(b"data: [DONE]\n\n")
        return response

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.args.metrics:
            return web.Response(status=404)
        labels = '{model_name="%s"}' % self.args.model
        lines = [f"vllm:prompt_tokens_total{labels} {self.prompt_tokens}",
                 f"vllm:generation_tokens_total{labels} {self.generation_tokens}",
                 f"vllm:num_requests_running{labels} {self.running}",
                 f"vllm:num_requests_waiting{labels} {self.waiting}",
                 f"vllm:kv_cache_usage_perc{labels} "
                 f"{self.running / self.args.max_running if self.args.max_running else min(1.0, 0.01 * self.running)}",
                 f"vllm:time_to_first_token_seconds_sum{labels} {self.ttft_sum}",
                 f"vllm:time_to_first_token_seconds_count{labels} {self.ttft_count}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def toks(self, text: str) -> list[str]:
        """The fake's tokens: words, or characters with --token-ids."""
        return list(text) if self.args.token_ids else tokenize(text)

    def too_long(self, n_prompt: int, max_tokens: int) -> web.Response | None:
        """vLLM's refusal of prompt + max_tokens above max_model_len (its renderer's text, HTTP 400)."""
        limit = self.args.max_model_len
        if not limit or n_prompt + max_tokens <= limit:
            return None
        return _error(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                           f"{max_tokens} output tokens and your prompt contains {n_prompt} input tokens, for a total "
                           f"of {n_prompt + max_tokens} tokens. Please reduce the length of the input prompt or the "
                           "number of requested output tokens.")

    def as_ids(self, lp: dict | None, body: dict) -> dict | None:
        """--token-ids and `return_tokens_as_token_ids`: tokens and top-k keys as `token_id:N`."""
        if lp is None or not self.args.token_ids or not body.get("return_tokens_as_token_ids"):
            return lp

        def key(t: str) -> str:
            m = re.fullmatch(r"<alt(\d+)>", t)
            return f"token_id:{0x10FF00 + int(m.group(1))}" if m else f"token_id:{ord(t)}"

        return {**lp, "tokens": [key(t) for t in lp["tokens"]],
                "top_logprobs": [None if top is None else {key(t): v for t, v in top.items()} for top in lp["top_logprobs"]]}

    async def tokenize_endpoint(self, request: web.Request) -> web.Response:
        if not self.args.token_ids:
            return web.Response(status=404)
        body = await request.json()
        text = "\n".join(m["content"] for m in body["messages"]) if body.get("messages") else body.get("prompt", "")
        ids = [ord(c) for c in text]
        return web.json_response({"count": len(ids), "max_model_len": self.args.max_model_len or 4096, "tokens": ids})

    def answer(self, prompt: str) -> str:
        m = re.search(r"\[\[answer=([^\]]*)\]\]", prompt)
        if m:
            text = m.group(1)
            if _h("wrong:" + prompt) < self.args.wrong_rate:
                text = "wrong"
        else:
            words = prompt.split()
            text = f"ok {words[-1] if words else ''}"
        if self.args.length_factor > 1:
            text = " ".join([text] * self.args.length_factor)
        if self.args.answer_tokens and self.args.token_ids:  # characters are the tokens
            chars = " " + text
            return "".join(chars[i % len(chars)] for i in range(self.args.answer_tokens))
        if self.args.answer_tokens:
            words = tokenize(" " + text)
            return "".join(words[i % len(words)] for i in range(self.args.answer_tokens))
        return " " + text  # a leading space: completions tokenize apart from the prompt

    def logprob(self, context: str, token: str, jitter: bool = False) -> float:
        lp = -0.05 - 2.0 * _h(context[-40:] + "|" + token)
        if self.args.logprob_noise:
            lp -= self.args.logprob_noise * _h("noise:" + context[-40:] + token)
        if jitter:
            lp -= 0.01 * _h(f"gpu:{self.args.noise_seed}:" + context[-40:] + token)
        return min(lp, -1e-4)

    def jittered(self, text: str) -> bool:
        """--gpu-noise: whether this server's batches move this prompt's logprobs (by its first 60 characters)."""
        return bool(self.args.gpu_noise) and _h(f"gpu-item:{self.args.noise_seed}:" + text[:60]) < self.args.gpu_noise

    def picked(self, text: str, rate: float, what: str) -> bool:
        """Whether a prompt (by its text's first 60 characters, the same in generation and in echo
        scoring) is among the `rate` share of prompts a fault hits."""
        return bool(rate) and _h(f"{what}:{self.args.noise_seed}:" + text[:60]) < rate

    def logprobs(self, prior: str, tokens: list[str], k: int, first_null: bool, warm: bool = False) -> dict:
        out_lp, top, offsets = [], [], []
        context, offset = prior, len(prior) if not first_null else 0
        jitter = self.jittered(prior + "".join(tokens))
        broken = self.picked(prior + "".join(tokens), self.args.broken_rate, "broken")
        nan = self.picked(prior + "".join(tokens), self.args.nan_rate, "nan")
        for i, tok in enumerate(tokens):
            lp = self.logprob(context, tok, jitter)
            if broken:  # a prompt broken badly (an fp8 scale overflowing on it): its logprobs far off
                lp = min(lp - self.args.broken_noise * (0.5 + 0.5 * _h("broken:" + context[-40:] + tok)), -1e-4)
            if nan and i == len(tokens) - 1:  # NaN logits: what an fp8 overflow gives
                lp = math.nan
            if warm and self.args.warm_noise:
                lp = min(lp - self.args.warm_noise * _h("warm:" + context[-40:] + tok), -1e-4)
            out_lp.append(None if (first_null and i == 0) else lp)
            alts = {tok: lp}
            for j in range(1, k):
                alts[f"<alt{j}>"] = lp - j - 0.5
            if k > 1 and self.args.top1_flip and _h("flip:" + context[-40:] + tok) < self.args.top1_flip:
                alts["<alt1>"] = lp / 2  # an alternative outranks the token here: top-1 moved
            top.append(None if (first_null and i == 0) else alts)
            offsets.append(offset)
            offset += len(tok)
            context += tok
        return {"tokens": tokens, "token_logprobs": out_lp, "top_logprobs": top, "text_offset": offsets}

    def failure(self, prompt: str) -> web.Response | None:
        n = self.counts[prompt]
        if "badrequest" in prompt:
            return _error(400, "bad request")
        if "broken" in prompt:
            return _error(500, "always broken")
        if "flaky" in prompt and n <= 2:
            return _error(503, "flaky: try again")
        if "ratelimit" in prompt and n <= 1:
            return _error(429, "slow down", headers={"Retry-After": "0.2"})
        return None

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body["prompt"]
        if isinstance(prompt, list):
            if prompt and isinstance(prompt[0], int):
                prompt = "".join(map(chr, prompt)) if self.args.token_ids else " ".join(f"t{t}" for t in prompt)
            else:
                prompt = prompt[0]
        self.counts[prompt] += 1
        if self.args.delay:
            await asyncio.sleep(self.args.delay)
        fail = self.failure(prompt)
        if fail is not None:
            return fail
        k = int(body.get("logprobs") or 0)
        prompt_tokens = self.toks(prompt)
        refused = self.too_long(len(prompt_tokens), int(body.get("max_tokens") or 16))
        if refused is not None:
            return refused
        if body.get("echo") and body.get("max_tokens") in (0, 1):
            if self.args.echo_flaky and self.counts[prompt] == 1:  # every echo fails once, then answers
                return _error(503, "echo: try again")
            self.cached(body, prompt_tokens)  # echo never reads the cache but writes it (vLLM v1)
            extra = ([" ."] if not self.args.token_ids else ["."]) if body.get("max_tokens") == 1 else []  # echo + one generated token (lm-eval's convention)
            choice = {"index": 0, "text": prompt + "".join(extra), "finish_reason": "length",
                      "logprobs": None if self.args.no_logprobs else
                      self.as_ids(self.logprobs("", prompt_tokens + extra, max(k, 1), first_null=True), body)}
            if self.args.echo_noise and choice["logprobs"]:  # a pass that never reproduces another
                lps = choice["logprobs"]["token_logprobs"]
                choice["logprobs"]["token_logprobs"] = [
                    None if v is None else min(v - self.args.echo_noise * random.random(), -1e-4) for v in lps]
            if self.args.echo_shift and choice["logprobs"]:  # a buggy echo: every logprob one position late
                lps = choice["logprobs"]["token_logprobs"]
                choice["logprobs"]["token_logprobs"] = [None] + lps[:-1]
            return _ok(body, [choice], len(prompt_tokens), len(extra))
        text = self.answer(prompt)
        max_tokens = int(body.get("max_tokens") or 16)
        tokens = self.toks(text)
        finish = "stop"
        if len(tokens) > max_tokens:
            tokens, finish = tokens[:max_tokens], "length"
            text = "".join(tokens)
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        hit = self.cached(body, prompt_tokens)
        if k and not self.args.no_logprobs:
            choice["logprobs"] = self.as_ids(self.logprobs(prompt, tokens, k, first_null=False, warm=bool(hit)), body)
        self.account(len(prompt_tokens), len(tokens))
        if body.get("stream"):
            return await self.stream(request, body, choice, len(prompt_tokens), chat=False)
        return _ok(body, [choice], len(prompt_tokens), len(tokens), cached=hit)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = "\n".join(m["content"] for m in body["messages"])
        self.counts[prompt] += 1
        fail = self.failure(prompt)
        if fail is not None:
            return fail
        refused = self.too_long(len(self.toks(prompt)), int(body.get("max_tokens") or 16))
        if refused is not None:
            return refused
        text = self.answer(prompt)
        tokens = self.toks(text)
        finish = "stop"
        if self.args.token_ids and len(tokens) > int(body.get("max_tokens") or 16):
            tokens, finish = tokens[:int(body.get("max_tokens") or 16)], "length"
            text = "".join(tokens)
        choice: dict = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish,
                        "logprobs": None}
        k = int(body.get("top_logprobs") or 0)
        hit = self.cached(body, self.toks(prompt))
        if body.get("logprobs") and not self.args.no_logprobs:
            lp = self.as_ids(self.logprobs(prompt, tokens, max(k, 1), first_null=False, warm=bool(hit)), body)
            choice["logprobs"] = {"content": [
                {"token": t, "logprob": l, "bytes": list(t.encode()),
                 "top_logprobs": [{"token": a, "logprob": v, "bytes": list(a.encode())} for a, v in top.items()][:k]}
                for t, l, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"])]}
        self.account(len(self.toks(prompt)), len(tokens))
        if body.get("stream"):
            return await self.stream(request, body, choice, len(self.toks(prompt)), chat=True)
        return _ok(body, [choice], len(self.toks(prompt)), len(tokens), chat=True, cached=hit)

    async def models(self, request: web.Request) -> web.Response:
        model = {"id": self.args.model, "object": "model", "owned_by": "fake", "created": 0}
        if self.args.max_model_len and not self.args.hide_max_model_len:
            model["max_model_len"] = self.args.max_model_len
        return web.json_response({"object": "list", "data": [model]})

    async def server_info(self, request: web.Request) -> web.Response:
        if not self.args.kv_cache_dtype and not self.args.kv_capacity_tokens:
            return web.Response(status=404)
        info = {"model_path": self.args.model, "kv_cache_dtype": self.args.kv_cache_dtype}
        if self.args.kv_capacity_tokens:
            info["max_total_num_tokens"] = self.args.kv_capacity_tokens
        return web.json_response(info)

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.counts))

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


def _ok(body: dict, choices: list, prompt_tokens: int, completion_tokens: int, chat: bool = False,
        cached: int | None = None) -> web.Response:
    usage: dict = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                   "total_tokens": prompt_tokens + completion_tokens}
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return web.json_response({
        "id": "cmpl-fake", "object": "chat.completion" if chat else "text_completion", "created": 0,
        "model": body.get("model", "fake"), "choices": choices, "usage": usage})


def _error(status: int, message: str, headers: dict | None = None) -> web.Response:
    return web.Response(status=status, headers=headers, content_type="application/json",
                        text=json.dumps({"error": {"message": message, "type": "fake", "code": status}}))


def make_app(args: argparse.Namespace) -> web.Application:
    fake = Fake(args)

    one_at_a_time = asyncio.Lock()
    serial = [0]  # requests in a --serial server: the one answered and those waiting
    capacity = asyncio.Semaphore(args.max_running) if args.max_running else None
    started: dict[str, float] = {}

    @web.middleware
    async def running(request: web.Request, handler):
        if request.method != "POST":
            return await handler(request)
        if args.serial:  # llama.cpp with one slot: the rest wait (vllm:num_requests_waiting)
            # the slot is busy while any request is in: a real one-slot server takes the next at
            # once, where this lock's hand-over leaves a moment in which a /metrics scrape saw none
            serial[0] += 1
            fake.running, fake.waiting = min(1, serial[0]), max(0, serial[0] - 1)
            try:
                async with one_at_a_time:
                    return await handler(request)
            finally:
                serial[0] -= 1
                fake.running, fake.waiting = min(1, serial[0]), max(0, serial[0] - 1)
        if capacity is not None and request.path.startswith("/v1/"):  # fixed capacity: the rest queue
            now = time.monotonic()
            held = now - started.setdefault("first", now) >= args.burst_s  # in the burst: admitted beside it
            if held:
                fake.waiting += 1
                try:
                    await capacity.acquire()
                finally:
                    fake.waiting -= 1
            fake.running += 1
            try:
                return await handler(request)
            finally:
                fake.running -= 1
                if held:
                    capacity.release()
        fake.running += 1
        try:
            return await handler(request)
        finally:
            fake.running -= 1

    @web.middleware
    async def echo_auth(request: web.Request, handler):
        response = await handler(request)
        if response.status >= 400 and isinstance(response, web.Response) and response.text:
            body = json.loads(response.text)
            body["error"]["message"] += f" (Authorization: {request.headers.get('Authorization')})"
            response.text = json.dumps(body)
        return response

    app = web.Application(middlewares=[running] + ([echo_auth] if args.echo_auth else []))
    app.add_routes([web.post("/v1/completions", fake.completions), web.post("/v1/chat/completions", fake.chat),
                    web.get("/v1/models", fake.models), web.get("/get_server_info", fake.server_info),
                    web.get("/stats", fake.stats), web.get("/health", fake.health),
                    web.get("/metrics", fake.metrics), web.post("/tokenize", fake.tokenize_endpoint)])
    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--wrong-rate", type=float, default=0.0)
    p.add_argument("--length-factor", type=int, default=1)
    p.add_argument("--answer-tokens", type=int, default=0)
    p.add_argument("--logprob-noise", type=float, default=0.0)
    p.add_argument("--top1-flip", type=float, default=0.0)
    p.add_argument("--no-logprobs", action="store_true")
    p.add_argument("--echo-shift", action="store_true")
    p.add_argument("--echo-flaky", action="store_true")
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--keepalive-s", type=float, default=75.0,
                   help="close a connection idle this long (uvicorn, which kvqual serve runs on, closes at 5 s)")
    p.add_argument("--serial", action="store_true")
    p.add_argument("--kv-cache-dtype", default=None)
    p.add_argument("--token-delay", type=float, default=0.0)
    p.add_argument("--stream-error", action="store_true")
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--prefix-cache", action="store_true")
    p.add_argument("--warm-noise", type=float, default=0.0)
    p.add_argument("--echo-auth", action="store_true")
    p.add_argument("--max-running", type=int, default=0)
    p.add_argument("--kv-capacity-tokens", type=int, default=0)
    p.add_argument("--burst-s", type=float, default=0.0)
    p.add_argument("--token-jitter", type=float, default=0.0)
    p.add_argument("--token-ids", action="store_true")
    p.add_argument("--max-model-len", type=int, default=0)
    p.add_argument("--gpu-noise", type=float, default=0.0)
    p.add_argument("--echo-noise", type=float, default=0.0)
    p.add_argument("--noise-seed", type=int, default=0)
    p.add_argument("--hide-max-model-len", action="store_true")
    p.add_argument("--broken-rate", type=float, default=0.0)  # this share of prompts (by hash) is broken …
    p.add_argument("--broken-noise", type=float, default=1.0)  # … its logprobs moved by half this to this many nats
    p.add_argument("--nan-rate", type=float, default=0.0)  # this share of prompts (by hash) answer NaN logprobs
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    assert math.isfinite(args.wrong_rate)
    web.run_app(make_app(args), host="127.0.0.1", port=args.port, print=None, access_log=None,
                keepalive_timeout=args.keepalive_s)
