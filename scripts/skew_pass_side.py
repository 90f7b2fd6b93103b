"""Measure the PASS side of the token criteria: how often each candidate statistic shows a
criterion inside its bound when its truth sits exactly on the bound (must be <= the level),
and how often it does for a working fp8 config (power), on the calibration's simulator.

The per-unit values of mean KL and top-1 disagreement are nonnegative and right-skewed (sample
skewness 2-5): a t bound on their mean is too short on the PASS side. Four statistics, each
tested one-sided at the fixed-n level α and at the sequential design's per-look level α′:

  t          cluster-robust t on the per-unit excess
  hall       the same through Hall's (1992) skewness correction (the gate before 2026-12-01)
  null       the SE taken under the null: the candidate rescaled so its excess is the bound
  null+hall  the null SE, then Hall's correction with the skewness of the rescaled differences

The gate uses null+hall for kl_excess and null for top1_loss (docs/statistics.md,
"Right-skewed token criteria"). Run:

    .venv/bin/python scripts/skew_pass_side.py --sims 2000
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate  # noqa: E402  the simulator the calibration uses

from kvqual.compare import stats as st  # noqa: E402
from kvqual.gate import nominal_alpha  # noqa: E402

METHODS = ("t", "hall", "null", "null+hall")


def passes(cand: np.ndarray, floor: np.ndarray, clusters: np.ndarray, bound: float, level: float) -> dict[str, bool]:
    """Whether each statistic shows mean(cand − floor) below `bound` at one-sided `level`."""
    x = cand - floor
    cl = clusters.astype(str)
    if np.all(x == x[0]):
        return {m: bool(x[0] < bound) for m in METHODS}
    mc = st.mean_ci(x, cl)
    q = stats.t.isf(level, mc.df)
    t = (mc.estimate - bound) / mc.se
    out = {"t": t < -q, "hall": st.hall_transform(t, st.cluster_skewness(x, cl), mc.n_clusters) < -q}
    for name, hall in (("null", False), ("null+hall", True)):
        out[name] = cand.mean() > 0 and st.null_scaled_z(cand, floor, bound, cl, hall) < -q
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sims", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20261201)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    policy = calibrate.POLICY
    levels = (policy.alpha, nominal_alpha(policy.alpha, calibrate.SEQ_LOOKS))
    bounds = {"kl_excess": policy.max_kl_excess, "top1_loss": policy.max_top1_loss}
    print(f"{args.sims} simulated compares per row, seed {args.seed}; 'on bound' must be <= the level "
          f"(Monte Carlo SE at 0.05: {math.sqrt(0.05 * 0.95 / args.sims):.4f}); 'working' is power.\n")
    print("| criterion | noise | items | level | truth | " + " | ".join(METHODS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(METHODS))
    for name, bound in bounds.items():
        for noise in (calibrate.DETERMINISTIC, calibrate.GPU):
            for truth, effect in (("on bound", calibrate.AT_BOUND[name]), ("working", calibrate.WORKING)):
                counts = {(n, lv): dict.fromkeys(METHODS, 0) for n in (31, 124) for lv in levels}
                for _ in range(args.sims):
                    sim = calibrate.simulate(rng, calibrate.DEFAULT_POOL, noise, effect)
                    if name == "kl_excess":
                        cand, floor = sim.kl_cand, sim.kl_floor
                    else:
                        cand, floor = 1 - sim.top1_cand, 1 - sim.top1_floor
                    for (n, lv), c in counts.items():
                        for m, ok in passes(cand[:n], floor[:n], sim.clusters[:n], bound, lv).items():
                            c[m] += ok
                for (n, lv), c in counts.items():
                    rates = " | ".join(f"{c[m] / args.sims:.3f}" for m in METHODS)
                    print(f"| {name} | {noise.label} | {n} | {lv:.4f} | {truth} | {rates} |", flush=True)


if __name__ == "__main__":
    main()
