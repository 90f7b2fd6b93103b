"""The command line: parse, call the library, print, map errors to exit codes.

Exit codes: 0 pass/ok, 1 fail, 2 usage or bad input, 3 inconclusive, 4 infrastructure.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Callable, Sequence

from kvqual import __version__
from kvqual.errors import KvqualError

EXAMPLES = """\
examples:
  kvqual compare bf16 fp8                      embedded default: bf16 vs fp8_e4m3 KV cache, end to end
  kvqual compare base cand --config kvqual.toml --suite suites/example.jsonl
  kvqual run bf16 --suite suites/example.jsonl  one target, one suite; re-run to resume
  kvqual report results/A results/B --aa results/A2
  kvqual serve --kv-cache-dtype fp8_e4m3 --port 30000
  kvqual suites                                 list the built-in suites
  kvqual sample prompts.jsonl.gz --n 500 --by category -o suites/train.jsonl

exit codes: 0 pass, 1 fail, 2 usage or bad input, 3 inconclusive, 4 infrastructure
"""


def _run_options(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--stream", action="store_true", default=None,
                   help="stream responses to measure time to first token and inter-token latency")
    p.add_argument("--config", help="config file (default ./kvqual.toml, else the built-in targets)")
    p.add_argument("--out", help="results folder (default results/)")
    p.add_argument("--include-path", help="folder of extra lm-eval task YAMLs")
    p.add_argument("--rerun", action="store_true", help="ignore a finished run with the same content; keep it as backup")


def _overrides(args: argparse.Namespace) -> dict:
    return {
        "suites": args.suites, "limit": args.limit, "concurrency": args.concurrency,
        "max_tokens": args.max_tokens, "top_logprobs": args.top_logprobs, "seed": args.seed,
        "temperature": args.temperature, "timeout": args.timeout, "retries": args.retries,
        "repeats": getattr(args, "repeats", None), "results_dir": args.out,
        "stream": args.stream,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvqual", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Is the faster serving config (e.g. an fp8 KV cache) as good as the baseline? "
                    "Paired statistics against an A/A noise floor; PASS / FAIL / INCONCLUSIVE.")
    parser.add_argument("--version", action="version", version=f"kvqual {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="run suites against one target and record every answer",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    p.add_argument("target", help="target name from the config ([targets.NAME])")
    _run_options(p)
    p.add_argument("--repeats", type=int, help="samples per item (for sampled decoding)")
    p.set_defaults(func=_cmd_run)

    from kvqual import commands

    commands.add_compare_parsers(sub, _run_options)

    p = sub.add_parser("serve", help="the embedded reference server (a real model, bf16 or fp8 KV cache)")
    from kvqual.serve import cli as serve_cli

    serve_cli.add_arguments(p)
    p.set_defaults(func=serve_cli.run)

    p = sub.add_parser("suites", help="list the built-in suites, or write one to a JSONL file")
    from kvqual.suites import generated

    generated.add_arguments(p)
    p.set_defaults(func=generated.run)

    p = sub.add_parser("sample", help="draw a stratified, reproducible sample of training prompts")
    from kvqual.suites import sample

    sample.add_arguments(p)
    p.set_defaults(func=sample.run)
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    from kvqual import commands

    return commands.cmd_run(args.target, _overrides(args), config_path=args.config, rerun=args.rerun,
                            include_path=args.include_path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KvqualError as exc:
        print(f"kvqual: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kvqual: interrupted; answers so far are saved — run the same command to resume", file=sys.stderr)
        return 130
    except asyncio.CancelledError:
        return 130
