"""Record what a real SGLang server answers to every request shape kvqual sends it, as JSON files
that tests/fakesglang.py is checked against (tests/fixtures/sglang/, tests/test_sglang_recorded.py).

Stdlib only (it runs on the GPU host beside the server, with no kvqual dependencies):

    python3 scripts/gpu/capture_sglang.py --port 30001 --out $OUT/sglang-bf16

One file per request: {"request": {method, path, body}, "status": int, "headers": {content-type},
"body": parsed JSON, or text for /metrics and /health}. Nothing is asserted here: the recording is
the engine's word, and the tests compare kvqual's parsing and the fake with it.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three primary colours."}]


def call(base: str, method: str, path: str, body: dict | None = None, timeout: float = 60.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer EMPTY"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, headers, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers), exc.read()
    text = raw.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    return {"request": {"method": method, "path": path, "body": body}, "status": status,
            "headers": {"content-type": headers.get("content-type") or headers.get("Content-Type")},
            "seconds": round(time.monotonic() - t0, 3), "body": parsed}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    a.out.mkdir(parents=True, exist_ok=True)
    shapes: list[tuple[str, str, str, dict | None]] = [
        ("health", "GET", "/health", None),
        ("models", "GET", "/v1/models", None),
        ("server_info", "GET", "/get_server_info", None),
        ("model_info", "GET", "/get_model_info", None),
        # the runner's generation request: greedy, top-5 logprobs, ids beside text (client.completion_payload)
        ("completion", "POST", "/v1/completions",
         {"model": a.model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 5,
          "return_token_ids": True, "return_tokens_as_token_ids": True}),
        ("chat", "POST", "/v1/chat/completions",
         {"model": a.model, "messages": CHAT, "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 5,
          "return_token_ids": True, "return_tokens_as_token_ids": True}),
        ("completion_stream", "POST", "/v1/completions",
         {"model": a.model, "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True,
          "stream_options": {"include_usage": True}, "return_token_ids": True}),
        # the echo path kvqual uses on vLLM: what SGLang makes of it (text_offset was -1 in the recipe)
        ("echo", "POST", "/v1/completions",
         {"model": a.model, "prompt": PROMPT + " Paris.", "max_tokens": 0, "temperature": 0, "logprobs": 5,
          "echo": True}),
        ("tokenize_prompt", "POST", "/tokenize", {"model": a.model, "prompt": PROMPT}),
        ("tokenize_messages", "POST", "/tokenize",
         {"model": a.model, "messages": CHAT, "add_generation_prompt": True}),
        ("metrics", "GET", "/metrics", None),
        ("flush_cache", "POST", "/flush_cache", None),
    ]
    for name, method, path, body in shapes:
        rec = call(base, method, path, body)
        (a.out / f"{name}.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
        print(f"{name}: {rec['status']} in {rec['seconds']} s")
    # teacher forcing through the native /generate (forcing/sglang.score_payload), on the ids the
    # server itself gave for the prompt and its greedy answer
    tok = json.loads((a.out / "tokenize_prompt.json").read_text())["body"]
    comp = json.loads((a.out / "completion.json").read_text())["body"]
    ids = list(tok.get("tokens") or []) if isinstance(tok, dict) else []
    choice = (comp.get("choices") or [{}])[0] if isinstance(comp, dict) else {}
    ids += list(choice.get("token_ids") or [])
    if ids:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0}, "return_logprob": True,
                "logprob_start_len": 0, "top_logprobs_num": 5, "return_text_in_logprobs": False}
        rec = call(base, "POST", "/generate", body)
        (a.out / "generate_score.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
        print(f"generate_score: {rec['status']} in {rec['seconds']} s ({len(ids)} ids)")
        many = {**body, "input_ids": [ids] * 8}  # a batch of 8, as a pass of many items would not send (one each)
        rec = call(base, "POST", "/generate", many)
        print(f"generate_score x8 batch: {rec['status']} in {rec['seconds']} s")
        # scoring through the cache (forcing/sglang.py, `sglang_score_step`): after a flush, the sequence up to
        # token k scored from k - 1, then up to k + 1 from k: the second finds the first's ids in the radix cache
        # (`meta_info.cached_tokens`), unless the server inserts none (--enable-deterministic-inference)
        call(base, "POST", "/flush_cache")
        k = len(ids) - 2
        for name, upto in (("generate_step_first", k + 1), ("generate_step_next", k + 2)):
            rec = call(base, "POST", "/generate", {**body, "input_ids": ids[:upto], "logprob_start_len": upto - 2})
            (a.out / f"{name}.json").write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
            meta = rec["body"].get("meta_info", {}) if isinstance(rec["body"], dict) else {}
            print(f"{name}: {rec['status']} in {rec['seconds']} s ({upto} ids, cached_tokens {meta.get('cached_tokens')})")
        for n in (1, 8, 32):  # how long one scoring request takes, alone: the recipe saw ~14 s a pass
            t0 = time.monotonic()
            for _ in range(n):
                call(base, "POST", "/generate", body)
            print(f"generate_score sequential x{n}: {time.monotonic() - t0:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
