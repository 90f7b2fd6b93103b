"""Measure the PASS side of the token criteria: how often each candidate statistic shows a
criterion inside its bound when its truth sits exactly on the bound (must be <= the level), how
often for a working fp8 config and for an unchanged one (power), and how often its upper bound is
finite at all, on the calibration's simulator (scripts/calibrate.py).

The per-unit values of mean KL and top-1 disagreement are nonnegative and right-skewed, and on a
GPU A/A almost all exactly 0. Three statistics, each tested one-sided at the fixed-n level α and at
the default plan's first-look level α′:

  t          cluster-robust t on the per-unit excess (SE 0 when nothing varies: "certain")
  null+hall  the SE taken under the null (the candidate rescaled so its excess is the bound), then
             Hall's skewness correction: the gate from 2026-12-01 to 2026-12-04
  bet        a betting confidence bound (Waudby-Smith & Ramdas) on values at most token_cap × the
             bound or the largest seen: the gate now (`criteria.token_excess`)

docs/statistics.md ("Token criteria") shows the table. Run:

    .venv/bin/python scripts/skew_pass_side.py --sims 1000
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import optimize, stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402  the simulator the calibration uses

from kvqual import stats as st  # noqa: E402
from kvqual.gate import look_sizes, nominal_alpha  # noqa: E402
from kvqual.gate import criteria as cr  # noqa: E402

METHODS = ("t", "null+hall", "bet")


def _null_z(c: np.ndarray, f: np.ndarray, bound: float) -> float:
    """The previous gate's statistic: excess over `bound` with the SE of the candidate rescaled to the
    null (mean excess = bound), through Hall's correction (one unit per cluster)."""
    d0 = c * ((f.mean() + bound) / c.mean()) - f
    se0 = d0.std(ddof=1) / math.sqrt(d0.size)
    diff = c.mean() - f.mean() - bound
    if se0 == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return st.hall_transform(diff / se0, float(stats.skew(d0, bias=False)) if d0.size > 2 else 0.0, d0.size)


def _null_upper(c: np.ndarray, f: np.ndarray, level: float) -> float:
    """The bound that inverts `_null_z` (inf where none does)."""
    if c.mean() <= 0:
        return math.nan
    q = stats.t.isf(level, c.size - 1)
    est = float(c.mean() - f.mean())
    scale = max(abs(est), float(np.abs(c).mean()), 1e-12)
    low, high = max(est, 0.0), max(est, 0.0) + scale
    gap = lambda b: _null_z(c, f, b) + q  # noqa: E731
    if gap(low) < 0:
        return low
    for _ in range(60):
        if gap(high) < 0:
            return float(optimize.brentq(gap, low, high, xtol=scale * 1e-9))
        low, high = high, high * 2
    return math.inf


def uppers(cand: np.ndarray, floor: np.ndarray, clusters: np.ndarray, bound: float, cap: float,
           level: float) -> dict[str, float]:
    """Each statistic's one-sided upper bound on mean(cand − floor) at `level`, one value per cluster."""
    codes = np.unique(clusters.astype(str), return_inverse=True)[1]
    size = np.bincount(codes)
    c, f = np.bincount(codes, weights=cand) / size, np.bincount(codes, weights=floor) / size
    x = c - f
    se = x.std(ddof=1) / math.sqrt(x.size)
    out = {"t": float(x.mean() + stats.t.isf(level, x.size - 1) * se)}
    out["null+hall"] = _null_upper(c, f, level) if c.mean() > 0 else (0.0 if not x.any() else math.nan)
    crit = cr.token_excess("x", bound, c, f, None, level, "", 1, cap)
    out["bet"] = crit.ci_high
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sims", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=20261204)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    policy = calibrate.POLICY
    pool = calibrate.DEFAULT_POOL
    first = look_sizes(pool, policy.looks, policy.first_look)
    levels = (policy.alpha, nominal_alpha(policy.alpha, tuple(first)))
    bounds = {"kl_excess": policy.max_kl_excess, "top1_loss": policy.max_top1_loss}
    truths = {"on bound": None, "working": calibrate.WORKING, "A/A": calibrate.Effect()}
    print(f"{args.sims} simulated compares per row, seed {args.seed}; 'on bound': shown inside must be <= the "
          f"level (Monte Carlo SE at 0.05: {math.sqrt(0.05 * 0.95 / args.sims):.4f}); 'working' and 'A/A': power; "
          "'finite': share of samples whose upper bound is finite.\n")
    print("| criterion | noise | items | level | truth | " + " | ".join(f"{m} inside" for m in METHODS)
          + " | " + " | ".join(f"{m} finite" for m in METHODS) + " |")
    print("|---|---|---|---|---|" + "---|" * (2 * len(METHODS)))
    for name, bound in bounds.items():
        cap = policy.token_cap * bound
        for noise in (calibrate.DETERMINISTIC, calibrate.GPU, calibrate.NOISY):
            for truth, effect in truths.items():
                effect = calibrate.AT_BOUND[name] if effect is None else effect
                if truth == "A/A" and noise is calibrate.DETERMINISTIC:
                    continue  # every value exactly 0: no statistic has anything to estimate
                counts = {(n, lv): {m: [0, 0] for m in METHODS} for n in (124, 496) for lv in levels}
                for _ in range(args.sims):
                    sim = calibrate.simulate(rng, 496, noise, effect)
                    if name == "kl_excess":
                        cand, floor = sim.kl_cand, sim.kl_floor
                    else:
                        cand, floor = 1 - sim.top1_cand, 1 - sim.top1_floor
                    for (n, lv), c in counts.items():
                        for m, u in uppers(cand[:n], floor[:n], sim.clusters[:n], bound, cap, lv).items():
                            c[m][0] += bool(u < bound)
                            c[m][1] += bool(math.isfinite(u))
                for (n, lv), c in counts.items():
                    inside = " | ".join(f"{c[m][0] / args.sims:.3f}" for m in METHODS)
                    finite = " | ".join(f"{c[m][1] / args.sims:.3f}" for m in METHODS)
                    print(f"| {name} | {noise.label} | {n} | {lv:.4f} | {truth} | {inside} | {finite} |", flush=True)


if __name__ == "__main__":
    main()
