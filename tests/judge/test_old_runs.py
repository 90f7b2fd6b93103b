"""Runs written before the token files (logprobs inline in samples.jsonl and the teacher files)
are judged exactly as the same runs in today's form."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from kvqual.forced import load_forced
from kvqual.judge.judge import judge
from kvqual.gate import GatePolicy
from kvqual.store import SAMPLES, load_samples

_spec = importlib.util.spec_from_file_location("bench_judge", Path(__file__).parents[2] / "benchmarks" / "bench_judge.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)


def _inline(folder: Path) -> None:
    """Rewrite a run folder the way kvqual wrote it before the token files."""
    samples = load_samples(folder)
    (folder / SAMPLES).write_text("".join(json.dumps(s.to_json()) + "\n" for s in samples.values()))
    for teacher in folder.glob("teacher-by-*.jsonl"):
        forced = load_forced(teacher)
        teacher.write_text("".join(json.dumps(f.to_json()) + "\n" for f in forced.values()))
    for arrow in folder.glob("*.tokens.arrow"):
        arrow.unlink()


def _judge(f) -> dict:
    report = judge(f.base, f.cand, f.aa, GatePolicy(), command="test").to_json()
    return {k: report[k] for k in ("verdict", "suites", "plots", "examples")}


def test_an_old_run_is_judged_as_its_new_form(tmp_path) -> None:
    new = bench.generate(bench.Spec(items=60, tokens=96), tmp_path / "new")
    old = bench.generate(bench.Spec(items=60, tokens=96), tmp_path / "old")
    for folder in (old.base, old.cand, old.aa):
        _inline(folder)
    assert not list((tmp_path / "old").rglob("*.tokens.arrow"))
    got, want = _judge(old), _judge(new)
    assert want["suites"]["overall"]["teacher"]["ab"]["n_items"] == 60  # the new form judged every item
    assert json.dumps(got, sort_keys=True, default=str) == json.dumps(want, sort_keys=True, default=str)
