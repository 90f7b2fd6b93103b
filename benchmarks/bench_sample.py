"""`kvqual sample` on a 1M-line JSONL: exact n, ±1 per stratum, reproducible, bounded memory.

Run: .venv/bin/python -m pytest benchmarks/bench_sample.py -s -p no:cacheprovider --benchmark-enable
Prints wall time, throughput, peak RSS growth and the file size; asserts the sample, never a time.
"""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from kvqual.suites.sample import sample_prompts

LINES = 1_000_000
N = 2_000
WEIGHTS = {"code": 40, "chat": 30, "math": 15, "tool_use": 10, "rare": 4, "tiny": 1}


def _write(path: Path) -> Counter[str]:
    rng = random.Random(0)
    cats, weights = zip(*WEIGHTS.items())
    counts: Counter[str] = Counter()
    with open(path, "w") as f:
        for i in range(LINES):
            cat = rng.choices(cats, weights)[0]
            counts[cat] += 1
            turns = [{"role": "user", "content": f"question {i} " + "lorem ipsum " * 8},
                     {"role": "assistant", "content": "an answer " * 10}]
            f.write(json.dumps({"id": f"r{i}", "category": cat, "messages": turns}) + "\n")
    return counts


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _subprocess_peak_rss_mib(path: Path) -> float:
    """Peak RSS of a fresh interpreter that only imports kvqual and samples `path`."""
    code = ("import resource, sys; from kvqual.suites.sample import sample_prompts; "
            f"sample_prompts(sys.argv[1], n={N}, by='category', seed=1); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip()) / 1024


def test_sample_1m_lines(benchmark, tmp_path: Path) -> None:
    path = tmp_path / "dump.jsonl"
    counts = _write(path)
    size_mib = path.stat().st_size / 2**20
    rss_before = _peak_rss_mib()
    t0 = time.perf_counter()
    items = benchmark.pedantic(sample_prompts, args=(path,), kwargs={"n": N, "by": "category", "seed": 1},
                               rounds=1, iterations=1)
    wall = time.perf_counter() - t0
    rss_growth = _peak_rss_mib() - rss_before
    got = Counter(it.category for it in items)
    worst = max(abs(got[c] - N * k / LINES) for c, k in counts.items())
    again = sample_prompts(path, n=N, by="category", seed=1)
    print(f"\nfile: {LINES:,} lines, {size_mib:.0f} MiB; sample n={len(items)} in {wall:.1f} s "
          f"({LINES / wall:,.0f} lines/s over two passes)")
    print(f"per-category |got - share| max = {worst:.3f}; counts {dict(sorted(got.items()))}")
    sub_rss = _subprocess_peak_rss_mib(path)
    print(f"peak RSS growth while sampling: {rss_growth:.1f} MiB; peak RSS of a process that only "
          f"samples: {sub_rss:.0f} MiB (file {size_mib:.0f} MiB); identical on a second run: {again == items}")
    assert len(items) == N and worst <= 1 and again == items and sub_rss < size_mib / 2
