"""`kvqual audit` on the embedded default, for real: outputs a broken fp8 KV cache generated, audited against bf16."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def kvqual(cwd, *args):
    return subprocess.run([sys.executable, "-m", "kvqual", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_outputs_of_a_broken_fp8_cache_fail_against_bf16(tmp_path):
    r = kvqual(tmp_path, "run", "fp8_broken", "--suite", "builtin:arith@16", "--out", "results")
    assert r.returncode == 0, r.stdout + r.stderr
    run, = [p for p in (tmp_path / "results").iterdir() if p.name.startswith("fp8_broken-")]
    subprocess.run([sys.executable, str(ROOT / "scripts" / "outputs_from_run.py"), str(run), "out.jsonl"],
                   cwd=tmp_path, check=True, capture_output=True)
    r = kvqual(tmp_path, "audit", "out.jsonl", "--against", "bf16", "--out", "results")
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(next((tmp_path / "results").glob("audit-*/report.json")).read_text())
    top1 = next(c for c in report["verdict"]["criteria"] if c["name"] == "top1_loss")
    assert top1["status"] == "fail" and top1["ci_low"] > 0.3  # the broken cache's tokens are rarely bf16's top-1
    assert report["figures"]["same_top1_with_reference"]["floor"] > 0.95  # bf16 scoring its own greedy outputs
