"""Server work to a decided verdict on the embedded default, sequential beside fixed-n:
`kvqual compare bf16 CAND` run twice in fresh folders (`--looks 4`, then `--fixed-n`), counting
the generation and teacher-forcing requests and the tokens each spent. Prints figures; asserts
nothing about times. Both use the same gate at the same α (the sequential one at Pocock's
nominal level per look, so its error rates match fixed-n's; docs/calibration.md).

Run: .venv/bin/python -m pytest benchmarks/bench_sequential_embedded.py -s -q --benchmark-enable
     (KVQUAL_BENCH_CANDIDATES=bf16,fp8 by default; about 4-5 minutes per compare on 2 CPU cores)
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

CANDIDATES = os.environ.get("KVQUAL_BENCH_CANDIDATES", "bf16,fp8").split(",")


def _work(results: Path) -> dict[str, int]:
    """Requests and tokens in every run folder and teacher-forced file under `results`."""
    requests = tokens = forced = forced_tokens = 0
    for samples in results.glob("*/samples.jsonl"):
        for line in samples.read_text().splitlines():
            s = json.loads(line)
            requests += 1
            tokens += (s.get("completion_tokens") or 0) + (s.get("prompt_tokens") or 0)
    for path in results.glob("*/teacher-by-*.jsonl"):
        for line in path.read_text().splitlines():
            f = json.loads(line)
            forced += 1
            forced_tokens += len((f.get("logprobs") or {}).get("tokens") or [])
    return {"generation requests": requests, "generation tokens (prompt + output)": tokens,
            "teacher-forcing requests": forced, "teacher-forced tokens": forced_tokens}


def _compare(tmp: Path, cand: str, *flags: str) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "kvqual", "compare", "bf16", cand, *flags], cwd=tmp,
                       capture_output=True, text=True, env={**os.environ, "CI": "true"})
    wall = time.perf_counter() - t0
    report = json.loads(next((tmp / "results").glob("compare-*/report.json")).read_text())
    seq = report["verdict"].get("sequential") or {}
    return {"verdict": report["verdict"]["verdict"], "exit": r.returncode, "wall_s": round(wall),
            "stop": seq.get("stop"), **_work(tmp / "results")}


@pytest.mark.parametrize("cand", CANDIDATES)
def test_sequential_vs_fixed_n_on_the_embedded_default(benchmark, tmp_path, cand):
    rows = benchmark.pedantic(lambda: {"sequential": _compare(tmp_path / "seq", cand),
                                       "fixed-n": _compare(tmp_path / "fixed", cand, "--fixed-n")},
                              rounds=1, iterations=1)
    seq, fixed = rows["sequential"], rows["fixed-n"]
    print(f"\n== kvqual compare bf16 {cand} (embedded default, profile:default) ==")
    for key in seq:
        ratio = ""
        if isinstance(seq[key], int) and isinstance(fixed[key], int) and fixed[key] and key != "exit":
            ratio = f"   sequential/fixed = {seq[key] / fixed[key]:.0%}"
        print(f"{key:<38} {str(seq[key]):<44} {str(fixed[key]):<44}{ratio}")
    assert seq["exit"] in (0, 1, 3) and fixed["exit"] in (0, 1, 3)
