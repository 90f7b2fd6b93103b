"""Server work to a decided verdict, sequential looks beside fixed-n, at equal error rates, on the
simulator of scripts/calibrate.py (the embedded default's mix: a noisy server, the GPU pattern, or a
deterministic server).

Equal error rates: both designs run the default `GatePolicy()` at α = 0.05 (the sequential one at
Pocock's nominal level per look, so its false-FAIL and false-PASS rates stay at α:
docs/calibration.md), and each design's pool is the smallest on a grid whose A/A compares PASS
at least TARGET_PASS of the time (the same β). At those pools the benchmark counts, per simulated
compare until it stopped, the server requests (generations of baseline, A/A replicate and
candidate, and the teacher-forcing passes) and the generated tokens, for an unchanged candidate
(A/A) and a broken one (KL excess 10× its bound, accuracy −20 points, loops on 30%). The target
to report against: sequential ≤ 40% of fixed-n. For reference it also runs the sequential design
on fixed-n's pool (same budget, lower PASS rate).

Run: .venv/bin/python -m pytest benchmarks/bench_sequential.py -s --benchmark-enable
     (single process; ~3-5 minutes on one core for both noise models)
Prints figures; asserts the error rates the comparison rests on, never a cost or a time.
"""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

_path = Path(__file__).resolve().parents[1] / "scripts" / "calibrate.py"
_spec = importlib.util.spec_from_file_location("kvqual_calibrate", _path)
calibrate = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = calibrate
_spec.loader.exec_module(calibrate)

TARGET_PASS = 0.90  # A/A PASS rate each design's pool must reach: the same β for both
TARGET_RATIO = 0.40  # sequential / fixed-n, the figure to report against
SEARCH_SIMS = 60  # per grid point while sizing a pool
SIMS = 200  # per measured cell
# pools on the default plan's schedule (124 items, then doubling: gate.look_sizes); "noisy" is the published
# A/A control (23% of outputs identical), "gpu" the GPU pattern (98.5%), "det" the embedded default
GRIDS = {"noisy": (124, 248, 496, 992, 1488, 2108), "gpu": (124, 248, 496, 992, 2108), "det": (124, 248, 496)}
ALPHA = calibrate.POLICY.alpha


def _cell(noise, pool: int, sequential: bool, effect, sims: int, seed: int):
    return calibrate.run_cell(seed, sims, pool, noise, effect, 1, designs=(sequential,))[sequential]


def _size_pool(noise, sequential: bool) -> tuple[int, float]:
    """The smallest pool of the grid whose A/A PASS rate reaches TARGET_PASS (SEARCH_SIMS each)."""
    grid = GRIDS[noise.key]
    for pool in grid:
        rate = _cell(noise, pool, sequential, calibrate.Effect(), SEARCH_SIMS,
                     calibrate.cell_seed(7, "size", noise.key, pool, sequential)).rate("PASS")
        if rate >= TARGET_PASS:
            return pool, rate
    return grid[-1], rate


def _mean_se(x: list) -> tuple[float, float]:
    a = np.asarray(x, float)
    return float(a.mean()), float(a.std(ddof=1) / math.sqrt(a.size))


def _fmt(x: list, scale: float = 1.0) -> str:
    m, s = _mean_se(x)
    return f"{m / scale:,.0f} ± {s / scale:,.0f}"


def _run(noise) -> dict:
    t0 = time.perf_counter()
    pools = {seq: _size_pool(noise, seq) for seq in (False, True)}
    out: dict = {"pools": pools, "cells": {}}
    for label, effect in (("A/A", calibrate.Effect()), ("broken", calibrate.BROKEN)):
        sims = SIMS if label == "A/A" else SIMS // 2
        for seq in (False, True):
            out["cells"][(label, seq)] = _cell(noise, pools[seq][0], seq, effect, sims,
                                               calibrate.cell_seed(8, label, noise.key, seq))
        out["cells"][(label, "same")] = _cell(noise, pools[False][0], True, effect, sims,
                                              calibrate.cell_seed(9, label, noise.key))
    out["seconds"] = time.perf_counter() - t0
    return out


def _print(noise, res: dict) -> None:
    pools, cells = res["pools"], res["cells"]
    name = {False: "fixed-n", True: "sequential", "same": "sequential, fixed-n's pool"}
    print(f"\n== {noise.label}: each design's pool sized for ≥ {TARGET_PASS:.0%} A/A PASS, α = {ALPHA} ==")
    print(f"pool search ({SEARCH_SIMS} sims per grid point): fixed-n {pools[False][0]} items "
          f"(PASS {pools[False][1]:.2f}), sequential {pools[True][0]} items (PASS {pools[True][1]:.2f})")
    head = (f"{'candidate':<11}{'design':<28}{'pool':>6}{'PASS':>7}{'FAIL':>7}{'items':>9}"
            f"{'requests':>18}{'gen. tokens':>20}")
    print(head)
    print("-" * len(head))
    for label in ("A/A", "broken"):
        for d in (False, True, "same"):
            c = cells[(label, d)]
            pool = pools[False][0] if d is False or d == "same" else pools[True][0]
            print(f"{label:<11}{name[d]:<28}{pool:>6}{c.rate('PASS'):>7.2f}{c.rate('FAIL'):>7.2f}"
                  f"{np.mean(c.items):>9.0f}{_fmt(c.requests):>18}{_fmt(c.tokens):>20}")
        f, s = cells[(label, False)], cells[(label, True)]
        rq = np.mean(s.requests) / np.mean(f.requests)
        tk = np.mean(s.tokens) / np.mean(f.tokens)
        verdict = "meets" if max(rq, tk) <= TARGET_RATIO else "does not meet"
        print(f"{'':<11}{'sequential / fixed-n':<28}{'':>6}{'':>7}{'':>7}"
              f"{np.mean(s.items) / np.mean(f.items):>9.0%}{rq:>18.0%}{tk:>20.0%}"
              f"   ({verdict} the ≤ {TARGET_RATIO:.0%} target)")
    print(f"({SIMS} simulated compares per A/A row, {SIMS // 2} per broken row; ± is one Monte Carlo SE; "
          f"{res['seconds']:.0f} s)")


def _check(res: dict) -> None:
    """The error rates the comparison rests on (binomial bounds at 0.1%)."""
    cells = res["cells"]
    for d in (False, True):
        aa, broken = cells[("A/A", d)], cells[("broken", d)]
        assert aa.verdicts["FAIL"] <= stats.binom.ppf(0.999, aa.sims, ALPHA), aa.verdicts
        assert aa.verdicts["PASS"] >= stats.binom.ppf(0.001, aa.sims, TARGET_PASS - 0.05), aa.verdicts  # same β
        assert broken.rate("FAIL") >= 0.9 and broken.verdicts["PASS"] == 0, broken.verdicts


@pytest.mark.parametrize("noise_key", ["noisy", "gpu", "det"])
def test_sequential_vs_fixed_n_at_equal_error_rates(benchmark, noise_key: str) -> None:
    noise = calibrate.NOISES[noise_key]
    res = benchmark.pedantic(lambda: _run(noise), rounds=1, iterations=1)
    _print(noise, res)
    _check(res)
