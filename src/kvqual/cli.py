"""The command line: parse, call the library, print, map errors to exit codes.

Exit codes: 0 pass/ok, 1 fail, 2 usage or bad input, 3 inconclusive, 4 infrastructure;
stopped by a signal: 128 + its number (130 Ctrl-C / SIGINT, 143 SIGTERM, 129 SIGHUP).
SIGTERM and SIGHUP (a CI runner cancelling the job, a closed terminal) stop a command the way
Ctrl-C does: the work is cancelled, servers kvqual launched are stopped, answers stay saved.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from typing import Callable, Iterator, NoReturn, Sequence

from kvqual import __version__
from kvqual.errors import KvqualError, redact
from kvqual.options import add_run_options, apply_env_defaults, overrides

EXAMPLES = """\
examples:
  kvqual compare bf16 fp8                      embedded default: bf16 vs fp8_e4m3 KV cache, end to end
  kvqual compare base cand --config kvqual.toml --suite suites/example.jsonl
  kvqual run bf16 --suite suites/example.jsonl  one target, one suite; re-run to resume
  kvqual report results/A results/B --aa results/A2
  kvqual calibrate base --good fp8 --bad fp8_e5m2 --out margins.toml   token margins on your model
  kvqual load bf16 fp8 --duration 240           steady-state throughput under load, fp8 over bf16
  kvqual serve --kv-cache-dtype fp8_e4m3 --port 30000
  kvqual suites                                 list the built-in suites
  kvqual sample prompts.jsonl.gz --n 500 --by category -o suites/train.jsonl

exit codes: 0 pass, 1 fail, 2 usage or bad input, 3 inconclusive, 4 infrastructure,
  128 + N when stopped by signal N (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP); answers so far are kept

environment: every long option of run, compare, report and load can be set as KVQUAL_<OPTION>
  (KVQUAL_CONFIG=ci.toml, KVQUAL_MAX_MINUTES=30, KVQUAL_FIXED_N=1, KVQUAL_SUITE=a.jsonl,b.jsonl);
  the command line wins
"""

ENV_COMMANDS = ("run", "compare", "report", "load", "audit")  # `serve` is launched by kvqual itself with explicit flags


class _Parser(argparse.ArgumentParser):
    """argparse's parser with a user mistake said in one line (exit 2), not a screen of usage: the
    message and where the usage is (`kvqual compare bf16`, one argument missing, printed 14 lines).
    Subcommands' parsers are of this class too (argparse makes them as their parent's type)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")  # as `kvqual serve` says it


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvqual", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Is the faster serving config (e.g. an fp8 KV cache) as good as the baseline? "
                    "Paired statistics against an A/A noise floor; PASS / FAIL / INCONCLUSIVE.")
    parser.add_argument("--version", action="version", version=f"kvqual {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="run suites against one target and record every answer",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    p.add_argument("target", help="target name from the config ([targets.NAME])")
    add_run_options(p)
    p.add_argument("--repeats", type=int, help="samples per item (for sampled decoding)")
    p.set_defaults(func=_cmd_run)

    from kvqual.compare import cli as compare_cli

    compare_cli.add_parsers(sub, add_run_options)

    from kvqual.audit import cli as audit_cli

    audit_cli.add_parser(sub, add_run_options)

    from kvqual.calibrate import cli as calibrate_cli

    calibrate_cli.add_parser(sub, add_run_options)

    from kvqual.load import cli as load_cli

    p = sub.add_parser("load", help="speed at saturation: steady-state tok/s of one or two targets under load",
                       description=load_cli.DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    load_cli.add_arguments(p)
    p.set_defaults(interrupted="load.json holds the targets measured before the stop (a load does not resume)")

    p = sub.add_parser("serve", help="the embedded reference server (a real model, bf16 or fp8 KV cache)")
    from kvqual.serve import cli as serve_cli

    serve_cli.add_arguments(p)
    p.set_defaults(func=serve_cli.run, own_signals=True)  # uvicorn handles SIGINT/SIGTERM itself

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

    return commands.cmd_run(args.target, overrides(args), config_path=args.config, rerun=args.rerun,
                            include_path=args.include_path)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_stopped_by: list[int] = []  # the first stop signal received (its number decides the exit code)


def _on_stop_signal(signum: int, frame: object) -> None:
    """SIGTERM / SIGHUP do what Ctrl-C does: inside `asyncio.run` its handler cancels the main task
    (launched servers are stopped on the way out), elsewhere it raises KeyboardInterrupt. A second
    signal, as a second Ctrl-C, interrupts the clean-up itself (launch.py still kills at exit)."""
    if not _stopped_by:
        _stopped_by.append(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a background job of a non-interactive shell): interrupt all the same
        raise KeyboardInterrupt


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP handled like SIGINT while the block runs (main thread only)."""
    try:
        previous = {sig: signal.signal(sig, _on_stop_signal) for sig in STOP_SIGNALS}
    except ValueError:  # not the main thread: signals cannot be handled here
        yield
        return
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _env_defaults(parser: argparse.ArgumentParser, environ: dict[str, str]) -> None:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ENV_COMMANDS:
        apply_env_defaults(sub.choices[name], environ)


def main(argv: Sequence[str] | None = None) -> int:
    import os

    parser = build_parser()
    try:
        _env_defaults(parser, dict(os.environ))
    except KvqualError as exc:
        print(f"kvqual: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    _stopped_by.clear()
    signals = contextlib.nullcontext() if getattr(args, "own_signals", False) else _stop_signals_interrupt()
    try:
        with signals:
            return int(func(args) or 0)
    except KvqualError as exc:
        print(f"kvqual: error: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except (KeyboardInterrupt, asyncio.CancelledError):
        how = f"stopped by {signal.Signals(_stopped_by[0]).name}" if _stopped_by else "interrupted"
        with contextlib.suppress(OSError):  # after SIGHUP the terminal may be gone
            note = getattr(args, "interrupted", "answers so far are saved — run the same command to resume")
            print(f"kvqual: {how}; {note}", file=sys.stderr)
        return 128 + (_stopped_by[0] if _stopped_by else signal.SIGINT)  # 130 Ctrl-C, 143 SIGTERM, 129 SIGHUP
    except Exception as exc:  # noqa: BLE001 - a bug in kvqual: never exit 1, which CI reads as "the candidate failed"
        return internal_error(exc)


INTERNAL_ERROR = 70  # sysexits.h EX_SOFTWARE: a bug in kvqual, not a verdict (0/1/3) nor bad input (2) nor the servers (4)


def internal_error(exc: BaseException) -> int:
    """One line on stderr and the traceback in a log file (its path in the line), exit INTERNAL_ERROR."""
    import tempfile
    import time
    import traceback

    text = "".join(traceback.format_exception(exc))
    where = "no log file could be written"
    for folder in (os.environ.get("KVQUAL_LOG_DIR"), os.path.join(os.path.expanduser("~"), ".cache", "kvqual"),
                   tempfile.gettempdir()):
        if not folder:
            continue
        try:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(redact(text))
            where = f"traceback in {path}"
            break
        except OSError:
            continue
    line = redact(f"{type(exc).__name__}: {exc}").splitlines()[0] if str(exc) else type(exc).__name__
    with contextlib.suppress(OSError):
        print(f"kvqual: internal error (a bug in kvqual, not a verdict; exit {INTERNAL_ERROR}): {line[:300]}; "
              f"{where} — please report it", file=sys.stderr)
    return INTERNAL_ERROR
