"""A finished compare found again: the same command run a second time judges the saved files
without starting a server.

Every answer and teacher-forcing score of a compare lands in its run folders, so running the
same `kvqual compare` again would send no request; but it cannot know the run folders' names
before the servers describe themselves (the model they serve names a run), so it used to start
both servers only to send nothing. A compare that ends (decided, or every planned look taken)
leaves a note under `results/.compares/`, named by a hash of everything that defines it — both
targets, the suites, the run settings and the gate policy — naming its compare folder. The same
command finds the note, judges the saved runs again (pure, over files: `judge.judge`) and
stops there. A compare a budget stopped leaves no note: run again, it takes its next look.
Anything missing or unreadable is no note at all: the compare runs as if none existed, and
reuses whatever answers it finds on disk as before.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvqual.errors import KvqualError
from kvqual.store import run_key, write_json_atomic

if TYPE_CHECKING:
    from kvqual.compare.flow import Compare
    from kvqual.judge.record import Judgement

NOTES = ".compares"


def compare_key(flow: Compare) -> str:
    """What defines a compare's outcome: both targets, the suites' contents, every run setting but
    where results go, the gate policy, teacher forcing on or off, and a --speed-from file (by size
    and modification time). Any change runs the compare again (its answers are still reused)."""
    run = {k: v for k, v in asdict(flow.run).items() if k != "results_dir"}
    speed_from = None
    if flow.run.speed_from:
        try:
            st = Path(flow.run.speed_from).stat()
            speed_from = [flow.run.speed_from, st.st_size, st.st_mtime_ns]
        except OSError:
            speed_from = [flow.run.speed_from, None, None]
    return run_key({"baseline": flow.base_t.identity(), "candidate": flow.cand_t.identity(),
                    "suites": [[s.ref.name, s.ref.sha256] for s in flow.suites], "run": run,
                    "gate": asdict(flow.config.gate), "teacher_forcing": flow.tf,
                    "allow_mismatch": flow.allow_mismatch, "speed_from": speed_from})


def note_path(flow: Compare) -> Path:
    return flow.root / NOTES / f"{flow.base_t.name}-vs-{flow.cand_t.name}-{compare_key(flow)[:16]}.json"


def remember(flow: Compare, out_dir: Path) -> None:
    """After the reports are written: note the compare folder of a compare that ended (not one a
    budget stopped, which a second run continues, nor one requests failed in: the same command again
    must send those again, exit 4's advice)."""
    report = flow.state.report
    if flow.state.stop is not None or report is None or report.verdict.infrastructure:
        return
    path = note_path(flow)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"folder": out_dir.name})


def recall(flow: Compare) -> Judgement | None:
    """The judgement of an earlier compare of this very plan, judged again from its saved runs, or
    None (no note, a file missing or unreadable, or a judgement that would now take another look)."""
    from kvqual.compare.verify import verify
    from kvqual.judge.judge import judge, load_report_inputs, runs_of_compare, saved_plan
    from kvqual.store import load_manifest

    try:
        note: Any = json.loads(note_path(flow).read_text(encoding="utf-8"))
        folder = flow.root / str(note["folder"])
        plan = saved_plan(folder, flow.config.gate)
        if plan is None or plan.stop is not None:
            return None
        a, b, aa = load_report_inputs(*runs_of_compare(str(folder), None))
        bm, cm = load_manifest(a), load_manifest(b)
        am = load_manifest(aa) if aa is not None else None
        warnings = verify(bm, cm, flow.allow_mismatch)
        report = judge(a, b, aa, flow.config.gate, command=flow.command, teacher_forcing=flow.tf,
                       warnings=warnings, allow_mismatch=flow.allow_mismatch, seed=flow.run.seed, plan=plan,
                       speed_from=flow.speed_from)
    except (OSError, ValueError, KeyError, TypeError, KvqualError):
        return None
    if report.verdict.infrastructure or not (report.decided or report.on_margin or len(report.sizes) == len(plan.planned)):
        return None
    s = flow.state
    s.bm, s.cm, s.am, s.warnings, s.report, s.looks_taken = bm, cm, am, warnings, report, len(report.sizes)
    return report
