"""What each CLI command does, as library calls: config → suites → (launch) → runner → compare → report.

The CLI parses arguments and prints; everything with a result lives here or below.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, Callable

from kvqual.config import Config, Overrides, RunDefaults, Target, load_config
from kvqual.errors import InfrastructureError
from kvqual.records import RunManifest
from kvqual.store import failure_summary
from kvqual.suites import LoadedSuite, load_suites

DEFAULT_PROFILE = "profile:default"


def prepare(config_path: str | None, overrides: dict[str, Any],
            include_path: str | None = None) -> tuple[Config, RunDefaults, tuple[LoadedSuite, ...]]:
    """Config + command-line overrides + loaded suites (any problem: exit 2 before a request)."""
    config = load_config(config_path)
    run = Overrides(overrides).apply(config.run)
    specs = run.suites or (DEFAULT_PROFILE,)  # no suites named: the default mix, as for the built-in targets
    suites = tuple(load_suites(specs, seed=run.seed, limit=run.limit, include_path=include_path))
    return config, run, suites


def cmd_run(target_name: str, overrides: dict[str, Any], *, config_path: str | None, rerun: bool,
            include_path: str | None) -> int:
    config, run, suites = prepare(config_path, overrides, include_path)
    target = config.target(target_name)
    manifest = asyncio.run(_run_one(target, suites, run, rerun))
    print_run_summary(manifest, run.results_dir)
    if manifest.counts.get("failed", 0):  # under max_failed_rate, but a run with holes is not a clean run
        raise InfrastructureError(incomplete_run_message(manifest, run.results_dir))
    return 0


def incomplete_run_message(manifest: RunManifest, results_dir: str) -> str:
    """One line for a run that ended with requests failed for good: how many, of which kind."""
    c, run_dir = manifest.counts, f"{results_dir}/{manifest.run_id}"
    return (f"{manifest.target}: run incomplete: {c.get('failed', 0)} of {c.get('units', 0)} requests failed "
            f"for good ({failure_summary(run_dir)}); errors are in {run_dir}/samples.jsonl — "
            "run the same command again to retry them")


async def _run_one(target: Target, suites: tuple[LoadedSuite, ...], run: RunDefaults, rerun: bool) -> RunManifest:
    from kvqual.launch import serving
    from kvqual.runner import run_target

    async with serving(target, run.results_dir) as ready:
        return await run_target(ready, suites, run, limit=run.limit, rerun=rerun)


def print_run_summary(manifest: RunManifest, results_dir: str, out: Callable[[str], Any] = print) -> None:
    c = manifest.counts
    out(f"{manifest.run_id}: {c.get('ok', 0)}/{c.get('units', 0)} answered, {c.get('failed', 0)} failed, "
        f"{c.get('retries', 0)} retries, {c.get('reconnects', 0)} reconnects ({manifest.status}) "
        f"→ {results_dir}/{manifest.run_id}")


def eprint(message: str) -> None:
    print(message, file=sys.stderr)
