"""`kvqual load TARGET [TARGET2]`: argument parsing and the call into the flow (load/session.py).

Imports nothing heavy at module level: `kvqual --help` builds this parser.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys

from kvqual.errors import InfrastructureError, UsageError

DESCRIPTION = """\
Speed at saturation: keeps --concurrency requests in flight (closed loop, streamed) for --duration
seconds against each target in turn, discards the warm-up, and reports steady-state output tok/s
and requests/s with batch-means 95% intervals, TTFT/ITL percentiles, and the server's own running /
queued requests and KV usage (time-weighted means) with its KV capacity. With two targets: the
second's steady throughput over the first's, with Fieller's interval, and the concurrency each
sustained. Results: results/load-<targets>-<time>/load.json (docs/speed.md); `kvqual compare BASE
CAND --speed-from results/load-…/` judges its speedup criterion on that ratio.
Exit: 0 measured, 2 bad input, 4 a target unreachable or too many failed requests."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="+", metavar="TARGET", help="one or two target names (baseline first)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of load per target, warm-up included (default 180)")
    p.add_argument("--concurrency", type=int,
                   help="requests kept in flight (default: 3 × what the first target's KV cache holds, "
                        "from its reported capacity and the prompts; 64 when it reports none)")
    p.add_argument("--max-tokens", type=int, help="max_tokens of every request (default: [run] max_tokens, 256)")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds to discard (default: max(2 × median generation time, 10%% of --duration))")
    p.add_argument("--suite", action="append", dest="suites", metavar="SPEC",
                   help="prompts: suite file (.jsonl), built-in name or profile:NAME (repeatable; default: "
                        "[run] suites, else the built-in `instruct`)")
    p.add_argument("--limit", type=int, help="at most N items per suite")
    p.add_argument("--temperature", type=float, help="default [run] temperature (0)")
    p.add_argument("--seed", type=int, help="prompt order and sampling seed (default 1234)")
    p.add_argument("--timeout", type=float, help="seconds per request (default 600)")
    p.add_argument("--config", help="config file (default ./kvqual.toml, else the built-in targets)")
    p.add_argument("--out", help="results folder (default results/)")
    p.set_defaults(func=cmd_load)


def cmd_load(args: argparse.Namespace) -> int:
    from kvqual.config import Overrides, load_config
    from kvqual.load.session import DEFAULT_DURATION_S, DEFAULT_SUITE, LoadOptions, run_load
    from kvqual.load.summary import print_table
    from kvqual.suites import load_suites

    if len(args.targets) > 2:
        raise UsageError(f"load takes one or two targets (baseline, candidate), got {len(args.targets)}")
    duration = DEFAULT_DURATION_S if args.duration is None else args.duration
    if not duration > 0:
        raise UsageError(f"--duration must be > 0 seconds (got {args.duration:g})")
    if args.warmup is not None and not 0 <= args.warmup < duration:
        raise UsageError(f"--warmup must be >= 0 and below --duration {duration:g} (got {args.warmup:g})")
    config = load_config(args.config)
    targets = [config.target(name) for name in args.targets]
    run = Overrides({"suites": args.suites, "limit": args.limit, "concurrency": args.concurrency,
                     "max_tokens": args.max_tokens, "seed": args.seed, "temperature": args.temperature,
                     "timeout": args.timeout, "results_dir": args.out}).apply(config.run)
    suites = tuple(load_suites(run.suites or (DEFAULT_SUITE,), seed=run.seed, limit=run.limit))
    opts = LoadOptions(duration_s=duration, concurrency=args.concurrency, warmup_s=args.warmup,
                       max_tokens=run.max_tokens, temperature=run.temperature, top_p=run.top_p, seed=run.seed,
                       timeout_s=run.timeout, max_failed_rate=run.max_failed_rate, results_dir=run.results_dir)
    command = shlex.join(["kvqual", "load", *sys.argv[2:]]) if sys.argv[1:2] == ["load"] else "kvqual load"
    result = asyncio.run(run_load(targets, suites, opts, command))
    print_table(result.doc)
    print(f"→ {result.folder}/load.json")
    if result.failure:
        raise InfrastructureError(result.failure)
    return 0
