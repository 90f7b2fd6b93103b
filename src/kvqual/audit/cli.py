"""`kvqual audit OUTPUTS --against REF [--candidate CAND]`: argument parsing and the command flow."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

from kvqual.errors import UsageError
from kvqual.options import overrides

DEFAULT_SAMPLE = 2108  # the sample the gate's default plan can reach (124 → 2,108 over five looks, as compare's pool)


def add_parser(sub: argparse._SubParsersAction, run_options: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "audit", help="judge outputs a config already produced against a reference server: PASS / FAIL / INCONCLUSIVE",
        description="Draws a seeded, stratified sample of OUTPUTS (JSONL: prompt or messages + completion, vLLM "
                    "outputs, OpenAI batch output with --batch-input; docs/audit.md), teacher-forces it on the "
                    "reference (and the candidate), against a floor of the reference's own outputs for the same "
                    "prompts, and gates it in looks. Exit: 0 pass, 1 fail, 2 bad input, 3 inconclusive, "
                    "4 infrastructure.")
    p.add_argument("outputs", help="the outputs to audit (JSONL)")
    p.add_argument("--against", required=True, metavar="TARGET", help="the reference target (e.g. bf16)")
    p.add_argument("--candidate", metavar="TARGET",
                   help="the config that produced the outputs, served: adds KL and top-1 between the two servers "
                        "over the audited tokens")
    p.add_argument("--batch-input", metavar="FILE", help="an OpenAI batch's input file (the prompts of its output lines)")
    p.add_argument("--sample", type=int, default=DEFAULT_SAMPLE,
                   help=f"outputs drawn from the file at most (default {DEFAULT_SAMPLE}); the looks take 124, then "
                        "twice as many, up to it")
    p.add_argument("--max-minutes", type=float,
                   help="server-time budget: a look starts only if, at the rate so far, it ends within it "
                        "(default 30; the built-in CPU targets 5; 0 = no limit)")
    p.add_argument("--looks", type=int, help="looks at most (default [gate] looks = 5); 1 = judge the sample once")
    p.add_argument("--json", action="store_true", help="print the verdict object on stdout; the summary goes to stderr")
    run_options(p)
    for action in p._actions:  # the shared help says "default 256": audit takes the file's, or this one
        if "--max-tokens" in action.option_strings:
            action.help = ("the max_tokens the outputs were generated with, for lines that do not state it (the "
                           "reference's own outputs, the floor, are generated with the same); needed when one "
                           "does not, else the audit stops with exit 2")
    p.set_defaults(func=cmd_audit)


def _out_dir(results: str, outputs: str, ref: str, cand: str | None, seed: int) -> Path:
    stem = Path(outputs).name.removesuffix(".jsonl")
    return Path(results) / (f"audit-{stem}-vs-{ref}" + (f"-{cand}" if cand else "") + f"-s{seed}")


def cmd_audit(args: argparse.Namespace) -> int:
    import json

    from kvqual.audit.flow import Audit
    from kvqual.config import load_config
    from kvqual.report import audit as report
    from kvqual.suites.outputs import draw, join_batch_input
    from kvqual.config import Overrides

    if args.sample < 2:
        raise UsageError("--sample must be at least 2")
    given = {a.split("=", 1)[0] for a in sys.argv[1:] if a.startswith("--")}  # not KVQUAL_* set for other commands
    for flag in ("--suite", "--limit", "--temperature", "--include-path"):
        if flag in given:  # the outputs file is the suite, and the floor is greedy (docs/audit.md)
            raise UsageError(f"{flag} does not apply to kvqual audit: the outputs file is what is judged, "
                             "and the floor is the reference's greedy outputs for its prompts")
    config = load_config(args.config)
    ov = {**overrides(args), "suites": None, "limit": None, "temperature": None}
    ov.update(max_minutes=args.max_minutes)
    run = Overrides(ov).apply(config.run)
    if args.looks is not None:
        if args.looks < 1:
            raise UsageError("--looks must be at least 1")
        config = replace(config, gate=replace(config.gate, looks=args.looks))
    ref = config.target(args.against)
    cand = config.target(args.candidate) if args.candidate else None
    drawn = draw(args.outputs, args.sample, run.seed)
    if args.batch_input:
        drawn = join_batch_input(drawn, args.batch_input)
    elif any(o.custom_id for o in drawn.outputs):
        raise UsageError(f"{args.outputs} holds OpenAI batch output lines, whose prompts are in the batch's input "
                         "file: give it with --batch-input FILE")
    out = _out_dir(run.results_dir, args.outputs, ref.name, cand.name if cand else None, run.seed)
    flow = Audit(config, run, drawn, str(args.outputs), ref, cand, out, args.max_tokens)
    result = asyncio.run(flow.execute())
    doc = {"kind": "audit", "command": "kvqual " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
           "reference": ref.name, "candidate": cand.name if cand else None, "floor_run": result.floor_run,
           "outputs": {"path": str(args.outputs), "lines": drawn.lines, "sample": len(drawn.outputs),
                       "strata": dict(drawn.strata), "allocation": dict(drawn.allocation)},
           "sequential": {"sizes": result.sizes, "planned": result.planned, "stop": result.stop},
           "verdict": result.verdict.to_json(), "figures": result.figures}
    paths = report.write(doc, out)
    text = sys.stderr if args.json else sys.stdout
    print(report.console(doc), file=text)
    print(f"\nreports: {', '.join(str(p) for p in paths.values())}", file=text)
    if args.json:
        print(json.dumps(doc["verdict"], indent=2, allow_nan=False))
    return int(doc["verdict"]["exit_code"])
