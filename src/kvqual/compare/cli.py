"""`kvqual compare` and `kvqual report`: argument parsing and the command flow."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path
from typing import Callable

from kvqual.compare import session
from kvqual.config import load_config


def add_parsers(sub: argparse._SubParsersAction, run_options: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("compare", help="baseline vs candidate with an A/A floor: PASS / FAIL / INCONCLUSIVE",
                       description="Runs (or reuses) the baseline, its A/A replicate and the candidate, "
                                   "teacher-forces the baseline's outputs on both, and gates the candidate. "
                                   "Exit: 0 pass, 1 fail, 2 bad input, 3 inconclusive, 4 infrastructure.")
    p.add_argument("baseline", help="baseline target name (e.g. bf16)")
    p.add_argument("candidate", help="candidate target name (e.g. fp8)")
    run_options(p)
    p.add_argument("--aa-fraction", type=float, help="share of items in the A/A replicate (default 1.0)")
    p.add_argument("--no-teacher-forcing", action="store_true", help="skip echo scoring (token metrics absent)")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="compare even when models or reported KV dtypes contradict the config (printed in the report)")
    p.set_defaults(func=cmd_compare)

    r = sub.add_parser("report", help="re-judge and re-render a comparison from saved runs (no server)")
    r.add_argument("run_a", help="baseline run folder (results/<run-id>)")
    r.add_argument("run_b", help="candidate run folder")
    r.add_argument("--aa", help="A/A replicate run folder (default: RUN_A-aa1 beside RUN_A)")
    r.add_argument("--config", help="config file whose [gate] policy to use")
    r.add_argument("--out", help="folder for the report files (default: results/compare-<a>-vs-<b>)")
    r.add_argument("--no-teacher-forcing", action="store_true")
    r.set_defaults(func=cmd_report)


def _command_line() -> str:
    return "kvqual " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def _out_dir(results_dir: str, base_run: str, cand_run: str, out: str | None) -> Path:
    return Path(out) if out else Path(results_dir) / f"compare-{base_run}-vs-{cand_run}"


def _finish(report: dict, out_dir: Path) -> int:
    paths = session.write_all(report, out_dir)
    print(session.console_summary(report))
    print(f"\nreports: {', '.join(str(p) for p in paths.values())}")
    return int(report["verdict"]["exit_code"])


def cmd_compare(args: argparse.Namespace) -> int:
    from kvqual.cli import _overrides
    from kvqual.commands import prepare, serving
    from kvqual.runner import run_target

    overrides = _overrides(args)
    overrides["aa_fraction"] = args.aa_fraction
    overrides["results_dir"] = None  # --out names the report folder here; runs stay in results/
    config, run, suites = prepare(args.config, overrides, args.include_path)
    base_t, cand_t = config.target(args.baseline), config.target(args.candidate)
    items = {(i.suite, i.id): i for s in suites for i in s.items}
    tf = not args.no_teacher_forcing

    async def flow():
        async with serving(base_t, run.results_dir) as t:
            bm = await run_target(t, suites, run, limit=run.limit, rerun=args.rerun)
            am = None
            if run.aa_fraction > 0:
                am = await run_target(t, suites, run, limit=run.limit, replicate=1, fraction=run.aa_fraction,
                                      rerun=args.rerun)
            base_dir = Path(run.results_dir) / bm.run_id
            if tf:
                await session._force(t, bm, base_dir, items, run, own_dir=base_dir, again=True)
        async with serving(cand_t, run.results_dir) as t:
            # refuse a comparison of the wrong thing before spending server time on it
            warnings = session.verify(bm, await session.as_reported(t, bm), args.allow_mismatch)
            # `compare bf16 bf16` is an A/A check: the candidate is a fresh, independent run (replicate 2)
            # of a freshly started server, never the baseline's own answers
            cm = await run_target(t, suites, run, limit=run.limit, rerun=args.rerun,
                                  replicate=2 if args.candidate == args.baseline else 0)
            if tf:
                await session._force(t, cm, base_dir, items, run, own_dir=Path(run.results_dir) / cm.run_id,
                                     again=False)
        return bm, am, cm, warnings

    bm, am, cm, warnings = asyncio.run(flow())
    root = Path(run.results_dir)
    report = session.judge(root / bm.run_id, root / cm.run_id, root / am.run_id if am else None, config.gate,
                           command=_command_line(), teacher_forcing=tf, warnings=warnings,
                           allow_mismatch=args.allow_mismatch, seed=run.seed)
    return _finish(report, _out_dir(run.results_dir, bm.run_id, cm.run_id, args.out))


def cmd_report(args: argparse.Namespace) -> int:
    a, b, aa = session.load_report_inputs(args.run_a, args.run_b, args.aa)
    config = load_config(args.config)
    bm, cm = session.load_manifest(a), session.load_manifest(b)
    warnings = session.verify(bm, cm, allow_mismatch=True)
    report = session.judge(a, b, aa, config.gate, command=_command_line(),
                           teacher_forcing=not args.no_teacher_forcing, warnings=warnings,
                           seed=bm.params.seed)
    report["command"] = _command_line()
    return _finish(report, _out_dir(str(a.parent), bm.run_id, cm.run_id, args.out))
