"""`kvqual compare` and `kvqual report`: argument parsing and the command flow."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from dataclasses import replace

from kvqual.config import Config, load_config
from kvqual.errors import UsageError
from kvqual.options import overrides

if TYPE_CHECKING:
    from kvqual.judge.record import LookPlan


SPEED_FROM_HELP = ("judge the speedup criterion on the steady-state throughput ratio of a `kvqual load` of the same "
                   "two targets (its load.json, or the folder holding it) instead of the compare's own requests; "
                   "[gate] min_speedup gates it, unset it is reported (docs/speed.md)")


def _builtin_epilog() -> str:
    """The built-in targets (kvqual serve on this machine), listed where a newcomer looks for them."""
    from kvqual.config import BUILTIN_TARGETS

    rows = [f"  {name:<20}KV cache {dtype}{'; kvqual serve' + extra if extra else ''}" for name, dtype, extra in BUILTIN_TARGETS]
    return ("built-in targets (no kvqual.toml needed: kvqual serve with the embedded model on this machine):\n"
            + "\n".join(rows) + "\nyour own servers: [targets.NAME] in kvqual.toml (README, \"Your own servers\")")


def add_parsers(sub: argparse._SubParsersAction, run_options: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("compare", help="baseline vs candidate with an A/A floor: PASS / FAIL / INCONCLUSIVE",
                       description="Runs (or reuses) the baseline, its A/A replicate and the candidate, "
                                   "teacher-forces the baseline's outputs on both, and gates the candidate. "
                                   "Exit: 0 pass, 1 fail, 2 bad input, 3 inconclusive, 4 infrastructure.",
                       epilog=_builtin_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("baseline", help="baseline target name (e.g. bf16)")
    p.add_argument("candidate", help="candidate target name (e.g. fp8)")
    run_options(p)
    p.add_argument("--aa-fraction", type=float,
                   help="share of items in the A/A generation replicate (default 0.25; 0 = none)")
    p.add_argument("--max-items", type=int, help="budget: items judged at most (default: every item of the suites)")
    p.add_argument("--max-minutes", type=float,
                   help="budget in server time: a round starts only if, at the rate so far, it would end within "
                        "this many minutes (default 30; the built-in CPU targets 5; 0 = no limit)")
    p.add_argument("--budget-tokens", type=int,
                   help="budget: no new round after this many generated tokens, all arms together "
                        "(--max-tokens is the per-request limit)")
    p.add_argument("--looks", type=int, help="looks of the sequential gate at most: 124 items, then twice as many "
                                             "each look up to the pool (default [gate] looks = 5)")
    p.add_argument("--fixed-n", action="store_true", help="judge once, on every item of the budget (= --looks 1)")
    p.add_argument("--strict", action="store_true",
                   help="every suite's accuracy must be shown within the margin too ([gate] mode = \"strict\")")
    p.add_argument("--no-teacher-forcing", action="store_true", help="skip echo scoring (token metrics absent)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare even when models or reported KV dtypes contradict the config (printed in the report)")
    p.add_argument("--speed-from", metavar="PATH", help=SPEED_FROM_HELP + " (default: [run] speed_from)")
    p.add_argument("--json", action="store_true",
                   help="print the verdict object (report.json's \"verdict\") on stdout; the summary goes to stderr")
    p.set_defaults(func=cmd_compare)

    r = sub.add_parser("report", help="re-judge and re-render a comparison from saved runs (no server)",
                       description="Re-judges the saved runs of a compare and writes its reports again. Give the "
                                   "compare's folder (results/compare-<a>-vs-<b>) or the two run folders.")
    r.add_argument("run_a", help="the compare's folder, or the baseline run folder (results/<run-id>)")
    r.add_argument("run_b", nargs="?", help="candidate run folder (when RUN_A is the baseline's run folder)")
    r.add_argument("--aa", help="A/A replicate run folder (default: RUN_A-aa1 beside RUN_A)")
    r.add_argument("--config", help="config file whose [gate] policy to use")
    r.add_argument("--out", help="folder for the report files (default: results/compare-<a>-vs-<b>)")
    r.add_argument("--no-teacher-forcing", action="store_true")
    r.add_argument("--looks", type=int, help="replay this many planned looks (default: the compare's plan)")
    r.add_argument("--fixed-n", action="store_true", help="judge once on every item (= --looks 1)")
    r.add_argument("--strict", action="store_true", help="[gate] mode = \"strict\"")
    r.add_argument("--speed-from", metavar="PATH", help=SPEED_FROM_HELP)
    r.add_argument("--json", action="store_true",
                   help="print the verdict object (report.json's \"verdict\") on stdout; the summary goes to stderr")
    r.set_defaults(func=cmd_report)


def _command_line() -> str:
    return "kvqual " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _out_dir(results_dir: str, base_run: str, cand_run: str, out: str | None) -> Path:
    return Path(out) if out else Path(results_dir) / f"compare-{base_run}-vs-{cand_run}"


def _finish(report: dict, out_dir: Path, as_json: bool = False) -> int:
    """Write the reports, append report.md to $GITHUB_STEP_SUMMARY (once per command), print."""
    import json
    import os

    from kvqual.report import write_all
    from kvqual.report.console import console_summary

    paths = write_all(report, out_dir)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(paths["md"].read_text(encoding="utf-8") + "\n")
    text = sys.stderr if as_json else sys.stdout
    print(console_summary(report), file=text)
    print(f"\nreports: {', '.join(str(p) for p in paths.values())}", file=text)
    if as_json:
        print(json.dumps(report["verdict"], indent=2, allow_nan=False))
    return int(report["verdict"]["exit_code"])


def cmd_compare(args: argparse.Namespace) -> int:
    from kvqual.commands import prepare
    from kvqual.compare.flow import Compare

    ov = overrides(args)
    ov.update(aa_fraction=args.aa_fraction, max_items=args.max_items, max_minutes=args.max_minutes,
              budget_tokens=args.budget_tokens, speed_from=args.speed_from)
    config, run, suites = prepare(args.config, ov, args.include_path)
    config = _gate_flags(config, args)
    base_t, cand_t = config.target(args.baseline), config.target(args.candidate)
    speed_from = None
    if run.speed_from:  # refuse a load.json of other targets before any request
        from kvqual.load import evidence

        speed_from = evidence.read(run.speed_from)
        speed_from.check_targets(base_t, cand_t)
    flow = Compare(config, run, suites, base_t, cand_t, teacher_forcing=not args.no_teacher_forcing,
                   allow_mismatch=args.allow_mismatch, rerun=args.rerun, command=_command_line(),
                   speed_from=speed_from)
    report = asyncio.run(flow.execute())
    s = flow.state
    assert s.bm is not None and s.cm is not None
    out = _out_dir(run.results_dir, s.bm.run_id, s.cm.run_id, None)
    code = _finish(report.to_json(), out, args.json)
    from kvqual.compare.earlier import remember

    remember(flow, out)  # the same command again judges these files without starting a server
    return code


def _gate_flags(config: Config, args: argparse.Namespace) -> Config:
    """--looks / --fixed-n / --strict override `[gate]`."""
    changes: dict = {}
    if getattr(args, "fixed_n", False):
        changes["looks"] = 1
    elif getattr(args, "looks", None) is not None:
        if args.looks < 1:
            raise UsageError(f"--looks must be at least 1 (got {args.looks})")
        changes["looks"] = args.looks
    if getattr(args, "strict", False):
        changes["mode"] = "strict"
    return replace(config, gate=replace(config.gate, **changes)) if changes else config


def _plan(*folders: Path, policy) -> LookPlan | None:
    """The look plan saved by the compare that wrote one of these folders' report.json."""
    from kvqual.judge.judge import saved_plan

    return next((p for p in (saved_plan(f, policy) for f in folders) if p is not None), None)


def cmd_report(args: argparse.Namespace) -> int:
    from kvqual.compare.verify import verify
    from kvqual.judge.judge import judge, load_report_inputs, runs_of_compare
    from kvqual.store import load_manifest

    run_a, run_b, aa_run = (args.run_a, args.run_b, args.aa) if args.run_b else runs_of_compare(args.run_a, args.aa)
    a, b, aa = load_report_inputs(run_a, run_b, aa_run)
    config = _gate_flags(load_config(args.config), args)
    bm, cm = load_manifest(a), load_manifest(b)
    out = _out_dir(str(a.parent), bm.run_id, cm.run_id, args.out)
    from kvqual.compare.planfile import check_report, recorded

    folder = _out_dir(str(a.parent), bm.run_id, cm.run_id, None)
    old = recorded(folder)
    if old and not (args.looks or args.fixed_n):  # replay the compare's own look schedule
        config = replace(config, gate=replace(config.gate, looks=old["looks"], first_look=old["first_look"]))
    check_report(folder, config.gate)  # never another plan for the same answers
    warnings = verify(bm, cm, allow_mismatch=True)
    speed_from = None
    if args.speed_from:
        from kvqual.load import evidence

        speed_from = evidence.read(args.speed_from)
    report = judge(a, b, aa, config.gate, command=_command_line(),
                           teacher_forcing=not args.no_teacher_forcing, warnings=warnings,
                           seed=bm.params.seed, plan=_plan(out, _out_dir(str(a.parent), bm.run_id, cm.run_id, None),
                                                           policy=config.gate), speed_from=speed_from)
    return _finish(report.to_json(), out, args.json)
