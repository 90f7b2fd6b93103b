"""Calibration by simulation: the gate's false-FAIL rate under A/A stays ≤ alpha, and a real
regression FAILs. Uses the noise model of scripts/calibrate.py (which writes docs/calibration.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from scipy import stats

from kvqual.gate import GatePolicy

_spec = importlib.util.spec_from_file_location(
    "kvqual_calibrate", Path(__file__).resolve().parents[2] / "scripts" / "calibrate.py"
)
calibrate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(calibrate)


def _max_fails(sims: int, alpha: float) -> int:
    """Largest FAIL count still consistent with a true rate ≤ alpha (one-sided 0.1% test)."""
    return int(stats.binom.ppf(0.999, sims, alpha))


def test_aa_false_fail_rate_within_alpha_default_policy() -> None:
    sims, policy = 500, GatePolicy()
    rates = calibrate.verdict_rates(np.random.default_rng(11), sims, 300, policy)
    assert rates["FAIL"] * sims <= _max_fails(sims, policy.alpha), rates
    assert rates["PASS"] > 0.5, rates  # an unchanged config mostly passes at n = 300


def test_aa_false_fail_rate_within_alpha_with_bounds_at_the_truth() -> None:
    """Every bound sits at the A/A truth, so each fail test is at its size: only Holm keeps
    the family at alpha (without it ≈ 4 criteria × alpha would FAIL)."""
    sims = 500
    policy = GatePolicy(accuracy_margin=1e-9, max_kl_excess=1e-9, max_top1_loss=1e-9, max_length_drift=1e-9)
    rates = calibrate.verdict_rates(np.random.default_rng(12), sims, 300, policy)
    fails = rates["FAIL"] * sims
    assert fails <= _max_fails(sims, policy.alpha), rates
    assert fails >= 5, rates  # the fail tests are live, not vacuous


def test_real_accuracy_regression_fails_most_of_the_time() -> None:
    rates = calibrate.verdict_rates(np.random.default_rng(13), 150, 300, GatePolicy(), accuracy_drop=0.15)
    assert rates["FAIL"] >= 0.8, rates
    assert rates["PASS"] == 0.0, rates
