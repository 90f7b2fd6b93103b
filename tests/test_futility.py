"""gate/futility.py: the "on its margin" stop. Its one promise is statistical: as a non-binding
futility rule it can never raise the false-PASS rate; its price is power. Both are measured here by
simulation on the gate's own pieces (criterion.one_sided, the Pocock levels, the geometric plan)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from kvqual.gate import GateInputs, GatePolicy, decide_sequence, look_sizes, nominal_alpha
from kvqual.gate import futility as fu
from kvqual.gate.criterion import one_sided
from test_gate import NO_TF, _accuracy, _ok_requests

DELTA = 0.05  # an accuracy-like margin: inside is above −δ
SD = 0.3  # per-item sd of the paired difference (~9% discordant items)


def _criterion(draws: np.ndarray, level: float, bound: float = -DELTA):
    n = draws.size
    c = one_sided("accuracy_pooled", None, "at_least", bound, float(draws.mean()), SD / math.sqrt(n), math.inf, n,
                  level, "", 1)
    status = "pass" if c.ci_low > bound else "fail" if c.ci_high < bound else "inconclusive"
    return c.__class__(**{**c.__dict__, "status": status})


def _run(truth: float, sims: int, seed: int, futility: bool, predictive: bool = True) -> tuple[int, int, int]:
    """(PASS, FAIL, stopped on the margin) counts over `sims` sequential compares on the default plan
    over a 2,108-item pool, each look at the Pocock level."""
    sizes = look_sizes(2108, 5, 124)
    level = nominal_alpha(0.05, tuple(sizes))
    rng = np.random.default_rng(seed)
    out = {"pass": 0, "fail": 0, "margin": 0}
    for _ in range(sims):
        draws = rng.normal(truth, SD, sizes[-1])
        for n in sizes:
            c = _criterion(draws[:n], level)
            if c.status != "inconclusive":
                out[c.status] += 1
                break
            if futility and (p := fu.decided_power([c], n, sizes[-1], predictive)) is not None \
                    and p < fu.FUTILITY_POWER:
                out["margin"] += 1
                break
    return out["pass"], out["fail"], out["margin"]


def test_the_futility_stop_never_raises_the_false_pass_rate_with_the_truth_on_the_bound() -> None:
    sims = 3000
    with_stop = _run(-DELTA, sims, 1, True)
    without = _run(-DELTA, sims, 1, False)
    # the same draws: a stop can only turn a later decision into INCONCLUSIVE, never make a PASS
    assert with_stop[0] <= without[0]
    # and the plan's α holds (one-sided binomial test at 0.1% does not reject a rate of 0.05)
    assert stats.binomtest(with_stop[0], sims, 0.05, alternative="greater").pvalue > 0.001
    # on the bound it stops often: that is the point (most such compares were never going to decide)
    assert with_stop[2] > 0.3 * sims, with_stop


def test_its_price_in_power_is_small_and_smaller_than_the_current_trend_rules() -> None:
    """Truth at half the margin (2.5 points down): the predictive rule may only cost a few PASSes;
    "conditional power at the current estimate" costs far more (measured: 1.0% against 22.6% of 2,000
    compares; gate/futility.py), which is why the stop is predictive."""
    sims = 1000
    without = _run(-DELTA / 2, sims, 2, False)
    predictive, trend = _run(-DELTA / 2, sims, 2, True), _run(-DELTA / 2, sims, 2, True, predictive=False)
    assert without[0] > 0.9 * sims
    assert predictive[0] >= without[0] - 0.03 * sims, (predictive, without)
    assert trend[0] < predictive[0] - 0.1 * sims, (trend, predictive)


def test_conditional_power_is_zero_at_the_last_look_and_high_when_far_inside() -> None:
    level = 0.03
    rng = np.random.default_rng(3)
    on_bound = _criterion(rng.normal(-DELTA, SD, 124), level)
    assert fu.conditional_power(on_bound, 124, 124) == (0.0, 0.0)
    inside = _criterion(np.full(124, 0.02) + rng.normal(0, SD, 124), level)
    p_pass, p_fail = fu.conditional_power(inside, 124, 2108)
    assert p_pass > 0.95 and p_fail < 1e-3
    # exactly on the bound: the last look passes or fails with the same chance, smaller the later the look
    exact = [one_sided("accuracy_pooled", None, "at_least", -DELTA, -DELTA, SD / math.sqrt(n), math.inf, n,
                       level, "", 1) for n in (124, 1038)]
    (early_pass, early_fail), (late_pass, late_fail) = (fu.conditional_power(c, c.n, 2108) for c in exact)
    assert early_pass == pytest.approx(early_fail, rel=1e-6) and late_pass == pytest.approx(late_fail, rel=1e-6)
    assert late_pass < early_pass < 0.5


def test_a_new_compare_total_is_the_textbook_sample_size_and_nothing_when_absurd() -> None:
    level = 0.05
    c = one_sided("accuracy_pooled", None, "at_least", -DELTA, 0.0, SD / math.sqrt(200), math.inf, 200, level, "", 1)
    n80 = fu.items_for_power(c, 200, 0.05, 0.80)
    z = stats.norm.isf(0.05) + stats.norm.ppf(0.80)
    assert n80 == math.ceil((z * SD / DELTA) ** 2)  # n = (z_α + z_β)²·σ²/δ²
    assert fu.items_for_power(c, 200, 0.05, 0.90) > n80
    hair = one_sided("accuracy_pooled", None, "at_least", -DELTA, -DELTA + 1e-4, SD / math.sqrt(200), math.inf, 200,
                     level, "", 1)
    assert fu.items_for_power(hair, 200, 0.05, 0.80) is None  # millions of items: not a plan


def test_a_sequential_gate_stops_on_the_margin_and_says_so() -> None:
    """Accuracy exactly 5 points down at look 1 of a 124 → 200 plan: the last look cannot decide it,
    the verdict stops INCONCLUSIVE at look 1 with `on_margin`, and no n_more is left in it. (Before
    issue 51 this compare ran to look 2 and advised "~N more items" past the pool.)"""
    looks = [(n, GateInputs(accuracy=(_accuracy(n, round(0.05 * n), 0),), coverage=NO_TF, **_ok_requests(n)))
             for n in (124, 200)]
    v = decide_sequence(GatePolicy(), looks, 0, planned=[124, 200])
    assert v.verdict == "INCONCLUSIVE" and v.exit_code == 3 and len(v.looks) == 1
    assert v.on_margin is not None and v.on_margin["look"] == 1 and v.on_margin["power"] < fu.FUTILITY_POWER
    assert v.reason.startswith("on its margin: accuracy_pooled ")
    assert "holds its bound -5.00 points (built-in default" in v.reason
    assert all(c.n_more is None for c in v.criteria)
    assert v.planning["criteria"]["accuracy_pooled"] == {"power_80": None, "power_90": None}  # on it: no size decides
    # far from the margin but undecided at look 1 (few items): it goes on
    clear = [(n, GateInputs(accuracy=(_accuracy(n, 2, 2),), coverage=NO_TF, **_ok_requests(n))) for n in (30, 200)]
    assert decide_sequence(GatePolicy(), clear, 0, planned=[30, 200]).on_margin is None


def test_a_plan_that_ends_undecided_far_from_its_bound_gives_a_new_compares_size_not_more_items() -> None:
    """40 items, 1 flip each way: far inside the margin but too few items. Not "on its margin"; the
    reason and `planning` state what a new compare needs; no n_more points past the 40-item pool."""
    v = decide_sequence(GatePolicy(), [(40, GateInputs(accuracy=(_accuracy(40, 1, 1),), coverage=NO_TF,
                                                       **_ok_requests(40)))], 0, planned=[40])
    assert v.verdict == "INCONCLUSIVE" and v.on_margin is None
    plan = v.planning["criteria"]["accuracy_pooled"]
    assert 40 < plan["power_80"] < plan["power_90"] < 4000
    assert f"a new compare (another --seed) needs ~{plan['power_80']:,} items for 80% power" in v.reason
    assert all(c.n_more is None for c in v.criteria)
