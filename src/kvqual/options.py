"""Command-line options shared by `run` and `compare`, and their mapping onto `[run]` overrides.

Both the top-level parser (cli.py) and the compare stage's parser (compare/cli.py) use this
module; neither imports the other.
"""

from __future__ import annotations

import argparse
from typing import Any, Mapping

from kvqual.errors import UsageError


def add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", action="append", dest="suites", metavar="SPEC",
                   help="suite file (.jsonl), built-in name, profile:NAME or lm-eval:TASK (repeatable)")
    p.add_argument("--limit", type=int, help="at most N items per suite")
    p.add_argument("--concurrency", type=int, help="requests in flight (default 32)")
    p.add_argument("--max-tokens", type=int, help="default max_tokens per item (default 256)")
    p.add_argument("--top-logprobs", type=int, help="top-k logprobs to record per token (default 5, max 20)")
    p.add_argument("--seed", type=int, help="sampling seed and request-order shuffle seed (default 1234)")
    p.add_argument("--temperature", type=float, help="default 0 (greedy)")
    p.add_argument("--timeout", type=float, help="seconds per request (default 600)")
    p.add_argument("--retries", type=int, help="retries for transient failures (default 5)")
    p.add_argument("--stall-seconds", type=float,
                   help="no answer for this long while requests wait: ask the server's /health; three failed asks "
                        "stop with exit 4 (default 120; 0 = never ask)")
    p.add_argument("--stream", action="store_true", default=None,
                   help="stream responses to measure time to first token and inter-token latency")
    p.add_argument("--config", help="config file (default ./kvqual.toml, else the built-in targets)")
    p.add_argument("--out", help="results folder (default results/)")
    p.add_argument("--include-path", help="folder of extra lm-eval task YAMLs")
    p.add_argument("--rerun", action="store_true", help="ignore a finished run with the same content; keep it as backup")


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `[run]` values the command line sets (None: keep the config's)."""
    return {
        "suites": args.suites, "limit": args.limit, "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "top_logprobs": args.top_logprobs, "seed": args.seed,
        "temperature": args.temperature, "timeout": args.timeout, "retries": args.retries,
        "stall_seconds": args.stall_seconds,
        "repeats": getattr(args, "repeats", None), "results_dir": args.out,
        "stream": args.stream,
    }


ENV_PREFIX = "KVQUAL_"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def env_name(option: str) -> str:
    """`--max-items` → `KVQUAL_MAX_ITEMS`."""
    return ENV_PREFIX + option.lstrip("-").replace("-", "_").upper()


def apply_env_defaults(p: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Every long option of `p` can be set as KVQUAL_<OPTION> (CI jobs set them once for every
    step); the command line wins. A flag reads 1/true/yes/on or 0/false/no/off; a repeatable
    option (`--suite`) takes a comma-separated list. A value of the wrong type is a usage error
    naming the variable."""
    for action in p._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in ("help", "version"):
            continue
        name = env_name(longs[0])
        if name not in environ:
            continue
        raw = environ[name].strip()
        if isinstance(action, argparse._StoreTrueAction):
            if raw.lower() not in _TRUE | _FALSE:
                raise UsageError(f"${name}={raw!r}: expected 1/true/yes/on or 0/false/no/off")
            action.default = raw.lower() in _TRUE
            continue
        values = [v.strip() for v in raw.split(",") if v.strip()] if isinstance(action, argparse._AppendAction) \
            else [raw]
        try:
            converted = [action.type(v) if action.type else v for v in values]
        except (TypeError, ValueError):
            raise UsageError(f"${name}={raw!r}: not a valid value for {longs[0]}") from None
        action.default = converted if isinstance(action, argparse._AppendAction) else converted[0]
