"""`kvqual calibrate BASE --good GOOD --bad BAD`: the command. Parse, run the two compares, print
the `[gate]` table (or write it with --out), map a refusal to its exit code (errors.py)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Callable

from kvqual.errors import UsageError

DESCRIPTION = (
    "Derives the token margins (max_kl_excess, max_top1_loss) on your own model, servers and suites: "
    "compares BASE with a config known to be good and one known to be bad (each fixed-n, teacher-forced, "
    "as `kvqual compare` does), takes M1 = the known-bad's lower confidence bound and the margin = "
    "--fraction × M1, and writes a [gate] table with its provenance for kvqual.toml. "
    "Exit: 0 written, 2 bad input (the known-bad is not worse than the known-good), "
    "3 their intervals overlap (more items would separate them), 4 infrastructure.")


def add_parser(sub: argparse._SubParsersAction, run_options: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("calibrate", help="derive the token margins on your model from a known-good and a known-bad config",
                       description=DESCRIPTION, conflict_handler="resolve")
    p.add_argument("baseline", help="baseline target name (e.g. bf16)")
    p.add_argument("--good", required=True, help="target known to be good (e.g. a healthy fp8_e4m3 KV cache)")
    p.add_argument("--bad", required=True, help="target known to be bad (e.g. fp8_e5m2, or a config that lost "
                                                "task score)")
    run_options(p)
    p.add_argument("--fraction", type=float, default=None,
                   help="the margin as a fraction of M1 (default 0.5, FDA's M2 = 50%% of M1)")
    # --out is the [gate] table here (the results folder is [run] results_dir)
    p.add_argument("--out", dest="toml_out", metavar="FILE", help="write the [gate] table to FILE (default: stdout)")
    p.set_defaults(func=cmd_calibrate, out=None)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from kvqual.calibrate.derive import DEFAULT_FRACTION, gate_table
    from kvqual.calibrate.flow import calibrate
    from kvqual.commands import prepare
    from kvqual.options import overrides

    fraction = DEFAULT_FRACTION if args.fraction is None else args.fraction
    if not 0 < fraction < 1:
        raise UsageError(f"--fraction must be between 0 and 1 (exclusive), got {fraction}")
    names = [args.baseline, args.good, args.bad]
    if len(set(names)) < 3:
        raise UsageError(f"calibrate needs three different targets, got {', '.join(names)}")
    config, run, suites = prepare(args.config, overrides(args), args.include_path)
    base, good, bad = (config.target(n) for n in names)
    command = "kvqual " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    cal, notes = calibrate(config, run, suites, base, good, bad, fraction, command)
    text = gate_table(cal, notes)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.toml_out:
        Path(args.toml_out).write_text(text, encoding="utf-8")
        print(f"[gate] table written to {args.toml_out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    for name in ("kl_excess", "top1_loss"):
        m = getattr(cal, name)
        print(f"{name}: margin {m.margin:.4g} = {fraction:g} × M1 {m.m1:.4g} (known-bad {m.bad[0]:.4g} "
              f"[{m.bad[1]:.4g}, {m.bad[2]:.4g}], known-good {m.good[0]:.4g} [{m.good[1]:.4g}, {m.good[2]:.4g}], "
              f"{cal.ci_level:.0%} intervals, {cal.items} items)", file=sys.stderr)
    return 0
