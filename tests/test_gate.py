"""kvqual.gate: policy validation, criteria statuses, verdict rules and report JSON."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from kvqual import stats as st
from kvqual.errors import ConfigError
from kvqual.gate import criteria as cr
from kvqual.gate import (
    AccuracyPairs, GateInputs, GatePolicy, LengthPairs, RatePairs, RequestCounts, TokenCoverage, TokenPairs, Verdict,
    decide, decide_sequence,
)

RNG = np.random.default_rng


def _by_name(v: Verdict) -> dict[str, object]:
    return {c.name if c.suite is None else f"{c.name}[{c.suite}]": c for c in v.criteria}


def _tokens(n: int, kl_shift: float = 0.0, top1_shift: float = 0.0, seed: int = 0) -> TokenPairs:
    rng = RNG(seed)
    return TokenPairs(
        kl_cand=rng.lognormal(np.log(0.002 + kl_shift), 0.5, n), kl_floor=rng.lognormal(np.log(0.002), 0.5, n),
        top1_cand=np.clip(rng.normal(0.99 - top1_shift, 0.01, n), 0, 1),
        top1_floor=np.clip(rng.normal(0.99, 0.01, n), 0, 1),
    )


def _accuracy(n: int, b: int, c: int, suite: str = "s") -> AccuracyPairs:
    """n items, b right→wrong, c wrong→right, the rest half both right, half both wrong."""
    base = np.zeros(n, bool)
    cand = np.zeros(n, bool)
    base[:b] = True
    cand[b:b + c] = True
    both = (n - b - c) // 2
    base[b + c:b + c + both] = cand[b + c:b + c + both] = True
    return AccuracyPairs(suite, base, cand)


def _lengths(n: int, factor: float = 1.0, seed: int = 1) -> LengthPairs:
    base = RNG(seed).lognormal(5, 0.5, n).round()
    return LengthPairs(base, (base * factor * RNG(seed + 1).lognormal(0, 0.05, n)).round())


def _ok_requests(n: int) -> dict[str, RequestCounts]:
    return {"base_requests": RequestCounts(0, n), "cand_requests": RequestCounts(0, n)}


NO_TF = TokenCoverage(requested=False)  # the user turned teacher forcing off: token criteria not required
STRICT = GatePolicy(mode="strict")


def test_policy_defaults_and_from_mapping() -> None:
    assert GatePolicy.from_mapping({}, "kvqual.toml") == GatePolicy()
    p = GatePolicy.from_mapping({"alpha": 0.1, "accuracy_margin": 0.02, "min_speedup": 1}, "k.toml")
    assert p.alpha == 0.1 and p.accuracy_margin == 0.02 and p.min_speedup == 1.0


@pytest.mark.parametrize("data,key,words", [
    ({"alpah": 0.05}, "gate.alpah", "unknown key"),
    ({"alpha": "0.05"}, "gate.alpha", "expected a number"),
    ({"max_kl_excess": True}, "gate.max_kl_excess", "expected a number"),
    ({"alpha": 0.7}, "gate.alpha", "between 0 and 0.5"),
    ({"accuracy_margin": -0.01}, "gate.accuracy_margin", "between 0 and 1"),
    ({"bootstrap_resamples": 1.5}, "gate.bootstrap_resamples", "expected an integer"),
    ({"bootstrap_resamples": 10}, "gate.bootstrap_resamples", "at least 100"),
    ({"looks": 0}, "gate.looks", "at least 1"),
    ({"mode": "lenient"}, "gate.mode", "strict"),
])
def test_policy_from_mapping_rejects_bad_values(data: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        GatePolicy.from_mapping(data, "kvqual.toml")
    assert err.value.path == "kvqual.toml" and err.value.key == key and words in err.value.problem


def test_clear_pass_with_everything_present() -> None:
    n = 600
    inputs = GateInputs(accuracy=(_accuracy(n, 10, 12),), lengths=_lengths(n), tokens=_tokens(n),
                        base_throughput=RNG(3).normal(20, 2, n), cand_throughput=RNG(4).normal(40, 4, n),
                        **_ok_requests(n))
    v = decide(GatePolicy(min_speedup=1.5), inputs, RNG(0))
    assert v.verdict == "PASS" and v.exit_code == 0, v.reason
    c = _by_name(v)
    assert all(x.status == "pass" for x in c.values())
    assert c["speedup"].estimate == pytest.approx(2.0, rel=0.05)
    assert c["accuracy[s]"].role == "guard" and c["accuracy_pooled"].role == "primary"


def test_large_accuracy_regression_fails_with_flips_reported() -> None:
    inputs = GateInputs(accuracy=(_accuracy(300, 60, 10),), coverage=NO_TF, **_ok_requests(300))
    v = decide(GatePolicy(), inputs, RNG(0))
    acc = _by_name(v)["accuracy[s]"]
    assert v.verdict == "FAIL" and v.exit_code == 1
    assert acc.status == "fail" and acc.estimate == pytest.approx(-50 / 300)
    assert acc.ci_high < -0.05 and acc.p_fail_holm < 0.05
    assert "right→wrong 60" in acc.detail and "wrong→right 10" in acc.detail


def test_small_sample_straddling_margin_is_inconclusive_with_n_more() -> None:
    inputs = GateInputs(accuracy=(_accuracy(60, 5, 3),), coverage=NO_TF, **_ok_requests(60))
    v = decide(GatePolicy(), inputs, RNG(0))
    c = _by_name(v)
    pooled, acc = c["accuracy_pooled"], c["accuracy[s]"]
    assert v.verdict == "INCONCLUSIVE" and v.exit_code == 3
    assert pooled.status == "inconclusive" and pooled.ci_low < -0.05 < pooled.ci_high
    # n_more stays a field (more items within a plan); the reason no longer advises "~N more" (issue 51:
    # a new compare's total is the planning statement of gate/futility.py)
    assert pooled.n_more is not None and pooled.n_more > 0 and "accuracy_pooled" in v.reason and "~" not in v.reason
    assert acc.status == "inconclusive" and "accuracy[s]" not in v.reason  # a guard does not hold PASS back


def test_no_flips_on_a_small_suite_still_asks_for_a_real_number_of_items() -> None:
    # 30 items, no flips: Tango's 90% interval is about ±0.083, so -0.05 is not shown; the
    # observed flip rate (0) must not promise "0 more items"
    inputs = GateInputs(accuracy=(_accuracy(30, 0, 0),), coverage=NO_TF, **_ok_requests(30))
    acc = _by_name(decide(STRICT, inputs, RNG(0)))["accuracy[s]"]
    assert acc.status == "inconclusive" and acc.ci_low < -0.05
    assert 30 <= acc.n_more <= 200


def test_guards_fail_a_collapsed_suite_but_do_not_block_pass() -> None:
    big, small = _accuracy(400, 4, 4, "big"), _accuracy(20, 0, 0, "small")
    v = decide(GatePolicy(), GateInputs(accuracy=(big, small), coverage=NO_TF, **_ok_requests(420)), RNG(0))
    assert v.verdict == "PASS", v.reason  # pooled shows ±5 points; the 20-item suite cannot, and need not
    assert _by_name(v)["accuracy[small]"].status == "inconclusive" and "guard" in v.reason
    strict = decide(STRICT, GateInputs(accuracy=(big, small), coverage=NO_TF, **_ok_requests(420)), RNG(0))
    assert strict.verdict == "INCONCLUSIVE" and "accuracy[small]" in strict.reason
    collapsed = _accuracy(40, 20, 0, "small")  # one suite loses half its answers; the pool barely moves
    v = decide(GatePolicy(), GateInputs(accuracy=(_accuracy(2000, 10, 10, "big"), collapsed), coverage=NO_TF,
                                        **_ok_requests(2040)), RNG(0))
    assert v.verdict == "FAIL" and _by_name(v)["accuracy[small]"].status == "fail"
    assert _by_name(v)["accuracy_pooled"].status == "pass"


def test_pooled_accuracy_is_stratified_by_suite() -> None:
    a, b = _accuracy(100, 10, 0, "a"), _accuracy(300, 0, 0, "b")
    pooled = _by_name(decide(GatePolicy(), GateInputs(accuracy=(a, b), coverage=NO_TF), RNG(0)))["accuracy_pooled"]
    assert pooled.estimate == pytest.approx(-10 / 400)  # weights = each suite's share of items
    # the stratified score test: each suite's variance under the null (Tango's restricted MLE at −δ),
    # SE² = Σ w_s²·V_s/n_s; its lower bound is the Δ0 at which the statistic reaches z
    tables = [st.PairedCounts(45, 10, 0, 45), st.PairedCounts(150, 0, 0, 150)]
    z = 1.6448536269514722

    def score(d0: float) -> float:
        var = 0.25**2 * st.tango_unit_variance(tables[0], d0) / 100 + 0.75**2 * st.tango_unit_variance(tables[1], d0) / 300
        return (pooled.estimate - d0) / np.sqrt(var)

    assert score(pooled.ci_low) == pytest.approx(z, rel=1e-6)
    assert pooled.p_pass == pytest.approx(st.norm_sf(score(-0.05)))
    assert "stratified score test over 2 suites" in pooled.detail


def test_repeats_are_one_unit_each() -> None:
    # the same 200 items sent 3 times at temperature 0 (identical repeats) is still 200 items of evidence
    once = _accuracy(200, 20, 10)
    clusters = np.repeat([f"item:s\x00{i}" for i in range(200)], 3)
    thrice = AccuracyPairs("s", np.repeat(once.base_correct, 3), np.repeat(once.cand_correct, 3), clusters)
    one = _by_name(decide(STRICT, GateInputs(accuracy=(once,), coverage=NO_TF), RNG(0)))["accuracy[s]"]
    three = _by_name(decide(STRICT, GateInputs(accuracy=(thrice,), coverage=NO_TF), RNG(0)))["accuracy[s]"]
    assert three.n == 200 and one.n == 200 and three.estimate == pytest.approx(one.estimate)
    assert (three.ci_high - three.ci_low) == pytest.approx(one.ci_high - one.ci_low, rel=0.1)
    tokens = _tokens(100)
    rep = TokenPairs(*(np.repeat(getattr(tokens, f), 3) for f in ("kl_cand", "kl_floor", "top1_cand", "top1_floor")),
                     clusters=np.repeat([f"item:s\x00{i}" for i in range(100)], 3))
    kl1 = _by_name(decide(GatePolicy(), GateInputs(tokens=tokens), RNG(0)))["kl_excess"]
    kl3 = _by_name(decide(GatePolicy(), GateInputs(tokens=rep), RNG(0)))["kl_excess"]
    assert kl3.n == 100 and (kl3.ci_high - kl3.ci_low) == pytest.approx(kl1.ci_high - kl1.ci_low, rel=0.05)


def test_kl_and_top1_beyond_floor_fail_far_out_and_pass_near_the_floor() -> None:
    v = decide(GatePolicy(), GateInputs(tokens=_tokens(200, kl_shift=0.054, top1_shift=0.12)), RNG(0))
    c = _by_name(v)
    assert c["kl_excess"].status == "fail" and c["top1_loss"].status == "fail" and v.verdict == "FAIL"
    v2 = decide(GatePolicy(), GateInputs(tokens=_tokens(200, kl_shift=0.004, top1_shift=0.01)), RNG(0))
    c2 = _by_name(v2)
    assert c2["kl_excess"].status == "pass" and c2["top1_loss"].status == "pass"


def test_a_missing_token_criterion_is_never_a_pass() -> None:
    good = dict(accuracy=(_accuracy(2000, 20, 20),), **_ok_requests(2000))
    # teacher forcing requested, nothing came back: the token criteria are open, so no PASS
    v = decide(GatePolicy(), GateInputs(**good, coverage=TokenCoverage(True, 2000, 0, Counter(
        {"chat prompt cannot be rendered": 2000}))), RNG(0))
    c = _by_name(v)
    assert v.verdict == "INCONCLUSIVE" and c["kl_excess"].status == "inconclusive"
    assert "chat prompt cannot be rendered: 2000" in c["kl_excess"].detail
    # most pairs usable but below min_token_coverage: shown, not decided
    cov = TokenCoverage(True, 400, 200, Counter({"prompt/completion boundary merged into one token": 200}))
    v = decide(GatePolicy(), GateInputs(**good, tokens=_tokens(200), coverage=cov), RNG(0))
    c = _by_name(v)
    assert v.verdict == "INCONCLUSIVE" and c["kl_excess"].status == "inconclusive"
    assert c["kl_excess"].estimate is not None and "50% < min_token_coverage 80%" in c["kl_excess"].detail
    # 799 of 1,000 is short of 80%, and says so (rounding once printed "80% < 80%")
    cov = TokenCoverage(True, 1000, 799, Counter({"tokens differ between the two servers": 201}))
    v = decide(GatePolicy(), GateInputs(**good, tokens=_tokens(799), coverage=cov), RNG(0))
    assert "79.9% < min_token_coverage 80%" in _by_name(v)["kl_excess"].detail
    # teacher forcing turned off by the user: not evaluated, and the rest may PASS
    v = decide(GatePolicy(), GateInputs(**good, coverage=NO_TF), RNG(0))
    assert v.verdict == "PASS" and _by_name(v)["kl_excess"].status == "not_evaluated"
    assert "--no-teacher-forcing" in _by_name(v)["kl_excess"].detail


def test_token_pairs_without_kl_judge_top1_alone() -> None:
    # `kvqual audit` without a candidate server scores the audited tokens on one server: top-1 agreement is
    # measured, KL is not; kl_excess is not evaluated (with why), never passed, and top-1 still decides
    good = dict(accuracy=(_accuracy(2000, 20, 20),), **_ok_requests(2000))
    t = _tokens(400)
    one = TokenPairs(None, None, t.top1_cand, t.top1_floor, kl_missing="no candidate server: KL needs its distribution")
    c = _by_name(decide(GatePolicy(), GateInputs(**good, tokens=one), RNG(0)))
    assert c["kl_excess"].status == "not_evaluated" and "no candidate server" in c["kl_excess"].detail
    assert c["top1_loss"].status == "pass"
    worse = TokenPairs(None, None, np.clip(t.top1_cand - 0.12, 0, 1), t.top1_floor, kl_missing="none")
    assert _by_name(decide(GatePolicy(), GateInputs(**good, tokens=worse), RNG(0)))["top1_loss"].status == "fail"
    with pytest.raises(ValueError, match="come together"):
        TokenPairs(t.kl_cand, None, t.top1_cand, t.top1_floor)


def test_bootstrap_option_agrees_with_t_on_clear_cases() -> None:
    pol = GatePolicy(bootstrap_resamples=999)
    assert _by_name(decide(pol, GateInputs(tokens=_tokens(200, kl_shift=0.054)), RNG(0)))["kl_excess"].status == "fail"
    assert _by_name(decide(pol, GateInputs(tokens=_tokens(200)), RNG(0)))["kl_excess"].status == "pass"


def test_length_blowup_fails_and_small_drift_passes() -> None:
    assert _by_name(decide(GatePolicy(), GateInputs(lengths=_lengths(200, 1.5)), RNG(0)))["length_ratio"].status == "fail"
    assert _by_name(decide(GatePolicy(), GateInputs(lengths=_lengths(200, 0.6)), RNG(0)))["length_ratio"].status == "fail"
    assert _by_name(decide(GatePolicy(), GateInputs(lengths=_lengths(200, 1.02)), RNG(0)))["length_ratio"].status == "pass"


def test_a_candidate_with_no_output_at_all_fails_on_length() -> None:
    base = LengthPairs(np.full(50, 40.0), np.zeros(50))
    c = _by_name(decide(GatePolicy(), GateInputs(lengths=base, coverage=NO_TF), RNG(0)))["length_ratio"]
    assert c.status == "fail" and c.estimate == 0


def test_loop_guard_fails_runaway_loops_beyond_the_floor() -> None:
    n = 120
    base = np.zeros(n)
    cand = (np.arange(n) % 3 == 0).astype(float)  # a third of the answers now loop
    floor_base, floor_aa = np.zeros(30), np.zeros(30)
    rp = RatePairs("loop", base, cand, None, floor_base, floor_aa)
    v = decide(GatePolicy(), GateInputs(rates=(rp,), coverage=NO_TF), RNG(0))
    c = _by_name(v)["loop_excess"]
    assert v.verdict == "FAIL" and c.status == "fail" and c.role == "guard"
    assert c.estimate == pytest.approx(1 / 3) and "A/A difference +0.000 over 30 pairs (shown, not subtracted)" in c.detail
    same = RatePairs("loop", base, base, None, floor_base, floor_aa)
    c = _by_name(decide(GatePolicy(), GateInputs(rates=(same,), coverage=NO_TF), RNG(0)))["loop_excess"]
    assert c.status == "pass" and c.estimate == 0


def test_length_shape_guard_fails_a_spread_the_mean_ratio_misses() -> None:
    n = 400
    base = RNG(3).lognormal(5, 0.3, n).round()
    cand = base * np.where(np.arange(n) % 2 == 0, 1.7, 0.3)  # half run long, half cut short: mean kept
    floor = LengthPairs(base[:100], base[:100])  # the A/A replicate reproduced the baseline
    v = decide(GatePolicy(), GateInputs(lengths=LengthPairs(base, cand), lengths_floor=floor, coverage=NO_TF),
               RNG(0))
    c = _by_name(v)
    assert 0.9 < c["length_mean_ratio"].estimate < 1.1 and c["length_mean_ratio"].status != "fail"
    assert c["length_mean_ratio"].role == "guard"
    # the geometric mean of the ratios sees it: √(1.7·0.3) ≈ 0.71
    assert c["length_ratio"].estimate == pytest.approx(np.sqrt(1.7 * 0.3), rel=0.02) and c["length_ratio"].status == "fail"
    ks = c["length_ks_excess"]
    assert ks.role == "guard" and ks.status == "fail" and v.verdict == "FAIL"
    assert ks.estimate == pytest.approx(st.ks_two_sample(base, cand).statistic)  # floor 0: the KS distance itself
    assert "A/A KS 0.000 over 100 pairs" in ks.detail


def test_length_shape_guard_subtracts_the_aa_floor_and_passes_a_small_jitter() -> None:
    n = 400
    base = RNG(4).lognormal(5, 0.5, n).round()
    jitter = (base * RNG(5).lognormal(0, 0.05, n)).round()
    floor = LengthPairs(base[:100], jitter[:100])  # the replicate moves as much as the candidate
    c = _by_name(decide(GatePolicy(), GateInputs(lengths=LengthPairs(base, jitter), lengths_floor=floor,
                                                 coverage=NO_TF), RNG(0)))["length_ks_excess"]
    d_ab, d_aa = st.ks_two_sample(base, jitter).statistic, st.ks_two_sample(base[:100], jitter[:100]).statistic
    assert c.estimate == pytest.approx(d_ab - d_aa) and c.status == "pass"
    one = decide(GatePolicy(), GateInputs(lengths=LengthPairs([5.0], [9.0]), coverage=NO_TF), RNG(0))
    assert _by_name(one)["length_ks_excess"].status == "not_evaluated"


def test_distinct2_guard_fails_outputs_that_repeat_themselves_beyond_the_floor() -> None:
    n = 150
    base = RNG(6).uniform(0.05, 0.3, n)  # repeated-bigram share = 1 − distinct-2
    cand = np.minimum(base + 0.2, 1.0)  # distinct-2 down 20 points on every output
    rp = RatePairs("repeated_bigrams", base, cand, None, base[:40], base[:40] + 0.01)
    v = decide(GatePolicy(), GateInputs(rates=(rp,), coverage=NO_TF), RNG(0))
    c = _by_name(v)["distinct2_loss"]
    assert v.verdict == "FAIL" and c.status == "fail" and c.role == "guard"
    assert c.estimate == pytest.approx((cand - base).mean())  # a paired difference: no A/A floor subtracted
    assert "A/A difference +0.010 over 40 pairs (shown, not subtracted)" in c.detail
    assert f"distinct-2 base {1 - base.mean():.3f} → cand {1 - cand.mean():.3f}" in c.detail
    same = RatePairs("repeated_bigrams", base, base, None, base[:40], base[:40])
    c = _by_name(decide(GatePolicy(), GateInputs(rates=(same,), coverage=NO_TF), RNG(0)))["distinct2_loss"]
    assert c.status == "pass" and c.estimate == 0


def test_a_floor_inside_one_cluster_is_taken_as_zero_not_a_crash() -> None:
    """A/A pairs that all share one context: no SE for the KS guard's floor, so it is left out as when
    there is no replicate, and the detail says so (the rate guards subtract no floor at all)."""
    base = RNG(7).uniform(0.05, 0.3, 60)
    one = np.array(["ctx:doc0"] * 6, dtype=object)
    rp = RatePairs("repeated_bigrams", base, base + 0.01, None, base[:6], base[:6] + RNG(8).uniform(0, 0.02, 6), one)
    c = _by_name(decide(GatePolicy(), GateInputs(rates=(rp,), coverage=NO_TF), RNG(0)))["distinct2_loss"]
    assert c.estimate == pytest.approx(0.01) and "over 6 pairs (shown, not subtracted)" in c.detail
    lengths = _lengths(60, 1.2)
    floor = LengthPairs(lengths.base[:6], lengths.base[:6] + np.arange(6), one)
    ks = _by_name(decide(GatePolicy(), GateInputs(lengths=lengths, lengths_floor=floor, coverage=NO_TF),
                         RNG(0)))["length_ks_excess"]
    assert ks.estimate == pytest.approx(st.ks_two_sample(lengths.base, lengths.cand).statistic)
    assert "floor taken as 0" in ks.detail


def test_new_guard_bounds_are_validated() -> None:
    pol = GatePolicy.from_mapping({"max_distinct2_loss": 0.1, "max_length_ks_excess": 0.2}, "kvqual.toml")
    assert (pol.max_distinct2_loss, pol.max_length_ks_excess) == (0.1, 0.2)
    for key in ("max_distinct2_loss", "max_length_ks_excess"):
        with pytest.raises(ConfigError, match=key):
            GatePolicy.from_mapping({key: 1.5}, "kvqual.toml")


def test_missing_parts_are_not_evaluated_and_do_not_pass() -> None:
    v = decide(GatePolicy(), GateInputs(coverage=NO_TF), RNG(0))
    assert v.verdict == "INCONCLUSIVE"
    assert all(c.status == "not_evaluated" for c in v.criteria)
    v2 = decide(GatePolicy(), GateInputs(accuracy=(_accuracy(2000, 20, 20),), coverage=NO_TF, **_ok_requests(2000)),
                RNG(0))
    c = _by_name(v2)
    assert v2.verdict == "PASS"  # teacher forcing off: token criteria reported, not required
    assert c["kl_excess"].status == "not_evaluated" and c["length_ratio"].status == "not_evaluated"


def test_too_many_failed_requests_is_an_infrastructure_fault_in_either_arm() -> None:
    """Both arms under one policy: at most max_failed_rate failed → the criterion passes; above it the
    run is not trusted, which is exit 4 (infrastructure), never FAIL (exit 1) nor PASS."""
    n = 2000
    good = dict(accuracy=(_accuracy(n, 20, 20),), coverage=NO_TF)
    ok = decide(GatePolicy(), GateInputs(**good, base_requests=RequestCounts(20, n, retries=7),
                                         cand_requests=RequestCounts(20, n)), RNG(0))
    assert ok.verdict == "PASS" and ok.exit_code == 0 and ok.infrastructure is None
    assert "20 of 2000 requests failed; 7 retries" in _by_name(ok)["failed_rate_baseline"].detail
    for base, cand in ((0, 30), (30, 0), (0, 400)):
        v = decide(GatePolicy(), GateInputs(**good, base_requests=RequestCounts(base, n),
                                            cand_requests=RequestCounts(cand, n)), RNG(0))
        arm = "candidate" if cand else "baseline"
        assert v.verdict == "INCONCLUSIVE" and v.exit_code == 4 and v.infrastructure, (base, cand)
        assert _by_name(v)[f"failed_rate_{arm}"].status == "inconclusive" and arm in v.infrastructure
        assert v.reason.startswith("infrastructure: requests failed after their retries")
        assert v.to_json()["exit_code"] == 4


def test_holm_adjustment_is_applied_across_criteria() -> None:
    # a marginal accuracy failure: alone in the fail family it fails; among more criteria Holm holds it back
    inputs_one = GateInputs(accuracy=(_accuracy(400, 50, 15),), coverage=NO_TF)
    c_one = _by_name(decide(GatePolicy(), inputs_one, RNG(0)))
    p_raw = c_one["accuracy[s]"].p_fail
    assert 0.01 < p_raw < 0.05
    many = GateInputs(accuracy=(_accuracy(400, 50, 15), _accuracy(400, 20, 20, "t"), _accuracy(400, 21, 20, "u")),
                      coverage=NO_TF)
    acc = _by_name(decide(GatePolicy(), many, RNG(0)))["accuracy[s]"]
    assert acc.p_fail_holm > p_raw and acc.status != "fail"


def test_clustered_accuracy_uses_cluster_robust_interval() -> None:
    acc = _accuracy(200, 30, 10)
    clustered = AccuracyPairs("s", acc.base_correct, acc.cand_correct, clusters=[f"ctx:{i // 10}" for i in range(200)])
    plain = _by_name(decide(STRICT, GateInputs(accuracy=(acc,)), RNG(0)))["accuracy[s]"]
    wide = _by_name(decide(STRICT, GateInputs(accuracy=(clustered,)), RNG(0)))["accuracy[s]"]
    assert "20 contexts" in wide.detail and (wide.ci_high - wide.ci_low) > (plain.ci_high - plain.ci_low)
    assert wide.n == 20 and wide.unit == "contexts"


def test_clustered_accuracy_without_flips_is_not_certain() -> None:
    # 24 questions on 12 documents, nothing flips: the cluster-robust SE is 0, but 12 documents cannot
    # show accuracy within 5 points; 480 documents can
    def verdict(n: int):
        same = np.arange(n) % 2 == 0
        pairs = AccuracyPairs("s", same, same, clusters=[f"ctx:{i // 2}" for i in range(n)])
        return _by_name(decide(STRICT, GateInputs(accuracy=(pairs,)), RNG(0)))["accuracy[s]"]

    small, large = verdict(24), verdict(960)
    assert small.status == "inconclusive" and small.ci_low < -0.05 and "floored" in small.detail
    assert small.n_more is not None and small.n_more > 12 and small.unit == "contexts"
    assert large.status == "pass"
    two_documents = verdict(4)  # t on 1 degree of freedom: the interval is clipped to [-1, 1]
    assert two_documents.ci_low == -1.0 and two_documents.ci_high == 1.0


def test_sequential_looks_test_at_the_pocock_level_and_stop_when_decided() -> None:
    pol = GatePolicy(looks=4)
    looks = [(n, GateInputs(accuracy=(_accuracy(n, 0, 0),), tokens=_tokens(n), lengths=_lengths(n),
                            **_ok_requests(n))) for n in (124, 248, 372, 496)]
    v = decide_sequence(pol, looks, 0)
    # the tail criterion bounds the share of broken prompts at 1% only from ~400 units (gate/tail.py):
    # looks 1-3 are left open by it alone, look 4 (496) decides
    assert v.verdict == "PASS" and len(v.looks) == 4, [r["verdict"] for r in v.looks]
    for row in v.looks[:3]:
        assert [k for k, c in row["criteria"].items() if c["status"] == "inconclusive"] == ["broken_share"]
    c = _by_name(v)
    assert c["kl_excess"].level == pytest.approx(0.0193, abs=2e-4)  # Pocock nominal level, K = 4, α = 0.05
    assert v.to_json()["sequential"]["looks"][0]["criteria"]["kl_excess"]["status"] == "pass"
    # a primary criterion shown inside at an earlier look stays shown
    first = v.looks[0]["criteria"]
    assert all(first[k]["status"] == "pass" for k in ("kl_excess", "top1_loss"))
    fixed = decide(GatePolicy(looks=1), looks[0][1], RNG(0))
    # a criterion shown inside at look 1 and undecided later is reported as decided at look 1
    wide = LengthPairs(RNG(9).lognormal(5, 2.0, 400), RNG(10).lognormal(5, 2.0, 400))
    narrow = _lengths(40)
    seq = decide_sequence(pol, [(40, GateInputs(accuracy=(_accuracy(40, 0, 0),), lengths=narrow, coverage=NO_TF)),
                                (400, GateInputs(accuracy=(_accuracy(400, 0, 0),), lengths=wide, coverage=NO_TF))], 0)
    assert seq.verdict == "PASS" and len(seq.looks) == 2 and seq.looks[0]["verdict"] == "INCONCLUSIVE"
    ln = _by_name(seq)["length_ratio"]
    assert ln.status == "pass" and ln.n == 40 and "shown inside at look 1 (40 items); at this look" in ln.detail
    assert seq.looks[1]["criteria"]["length_ratio"]["n"] == 40  # the trajectory keeps the values that decided it
    assert _by_name(fixed)["kl_excess"].level == 0.05


def test_inputs_reject_mismatched_arrays() -> None:
    with pytest.raises(ValueError):
        AccuracyPairs("s", [True, False], [True])
    with pytest.raises(ValueError):
        TokenPairs([0.1, 0.2], [0.1], [1, 1], [1, 1])


def test_verdict_to_json_is_strict_json() -> None:
    v = decide(GatePolicy(), GateInputs(accuracy=(_accuracy(300, 60, 10),), lengths=_lengths(50)), RNG(0))
    data = json.loads(json.dumps(v.to_json(), allow_nan=False))
    assert data["verdict"] == "FAIL" and data["exit_code"] == 1
    assert data["policy"]["accuracy_margin"] == 0.05
    assert {c["name"] for c in data["criteria"]} >= {"accuracy", "accuracy_pooled", "kl_excess", "length_ratio",
                                                      "failed_rate_candidate"}


def test_n_more_of_a_skewed_token_criterion_inverts_the_bound_that_decides_it() -> None:
    # right-skewed per-item KL whose mean sits inside the bound: the pass side is a betting bound, so
    # n_more must invert *that* bound. Holding the sample's shape and mean (the same items cycled),
    # n_more more items pass and half as many more do not.
    rng = np.random.default_rng(7)
    kl = rng.lognormal(-6.5, 1.6, size=40)
    kl *= 0.006 / kl.mean()

    def judged(n: int) -> cr.Criterion:
        values = np.resize(kl, n)
        values *= 0.006 / values.mean()
        return cr.token_excess("kl_excess", 0.012, values, np.zeros(n), None, 0.05, "", 8, 0.12)

    c = judged(40)
    assert c.status == "inconclusive" and c.p_pass >= 0.05 and c.n_more is not None and c.n_more >= 4
    assert judged(40 + c.n_more).p_pass < 0.05
    assert judged(40 + c.n_more // 2).p_pass >= 0.05


def test_teacher_forcing_lost_to_failed_requests_is_infrastructure_not_more_items() -> None:
    """The fault-injection finding: one forcing request failed after its retries, coverage fell to 799
    of 1,000 (under min_token_coverage 80%) with KL 20× inside its bound, and the gate said "~1 more
    items". Requests that failed are retried by running the command again: exit 4, no n_more."""
    n = 1000
    tokens = _tokens(n)
    failed = TokenCoverage(True, n, 799, Counter({"teacher-forcing request failed: connection reset": 201}), failed=201)
    v = decide(GatePolicy(), GateInputs(accuracy=(_accuracy(n, 0, 0),), tokens=tokens, lengths=_lengths(n),
                                        coverage=failed, **_ok_requests(n)), RNG(0))
    kl = _by_name(v)["kl_excess"]
    assert v.exit_code == 4 and v.infrastructure and kl.infrastructure and kl.n_more is None
    assert "201 teacher-forcing requests failed after their retries" in kl.detail and "again" in kl.detail
    # left out for what the data is (tokens that do not line up): not a fault to retry, INCONCLUSIVE (exit 3)
    other = TokenCoverage(True, n, 700, Counter({"tokens differ between the two servers": 300}))
    v = decide(GatePolicy(), GateInputs(accuracy=(_accuracy(n, 0, 0),), tokens=tokens, lengths=_lengths(n),
                                        coverage=other, **_ok_requests(n)), RNG(0))
    assert v.exit_code == 3 and not v.infrastructure and not _by_name(v)["kl_excess"].infrastructure
    # failures that would not have lifted coverage to the minimum: the data is short anyway
    both = TokenCoverage(True, n, 600, Counter({"tokens differ between the two servers": 300,
                                                "teacher-forcing request failed: timeout": 100}), failed=100)
    v = decide(GatePolicy(), GateInputs(accuracy=(_accuracy(n, 0, 0),), tokens=tokens, lengths=_lengths(n),
                                        coverage=both, **_ok_requests(n)), RNG(0))
    assert v.exit_code == 3


def test_coverage_short_by_one_refused_answer_is_infrastructure_not_a_spent_pool() -> None:
    """Issue 53's A/A: 1,000 items, a fifth chat (no token ids: left out), one baseline answer refused
    for good (0.1%, tolerated). The pair is out of the coverage (999 pairs, 799 usable = 79.98% <
    80%) and the gate said "~1 more items; the pool is spent" (exit 3). The shortfall is the failed
    answer's: exit 4, run again, never a request for more items."""
    n = 999
    chat = Counter({"chat item: no token ids for the rendered prompt": 200})
    refused = TokenCoverage(True, n, 799, chat, unanswered=1)
    v = decide(GatePolicy(), GateInputs(accuracy=(_accuracy(n, 0, 0),), tokens=_tokens(799), lengths=_lengths(n),
                                        coverage=refused, **_ok_requests(n)), RNG(0))
    kl = _by_name(v)["kl_excess"]
    assert v.exit_code == 4 and kl.infrastructure and kl.n_more is None
    assert "1 answer request failed after their retries" in kl.detail and "again" in kl.detail
    # the same shortfall with every answer in: the data is short (exit 3, more items would mend it)
    v = decide(GatePolicy(), GateInputs(accuracy=(_accuracy(n, 0, 0),), tokens=_tokens(799), lengths=_lengths(n),
                                        coverage=TokenCoverage(True, n, 799, chat), **_ok_requests(n)), RNG(0))
    assert v.exit_code == 3 and not _by_name(v)["kl_excess"].infrastructure


def test_every_bound_is_finite_where_all_pairs_but_one_are_identical() -> None:
    """The GPU A/A: 123 of 124 pairs bit-identical, one slightly different, in every input the gate
    reads. Every criterion's interval has two finite ends (the token criteria's PASS side used to be
    [8.5e-06, inf) there); at the first look of the default plan everything but the share of broken
    prompts is shown inside, and that share is bounded only at ~4% by 124 units (1% takes ~400):
    the same pattern over 511 items, the third look, PASSes."""
    n = 124
    one = np.zeros(n)
    one[7] = 4e-3
    top1 = np.ones(n)
    top1[7] = 0.97
    base_len = RNG(1).integers(5, 60, n).astype(float)
    cand_len = base_len.copy()
    cand_len[7] += 3
    acc = _accuracy(n, 0, 0)
    inputs = GateInputs(accuracy=(acc,), tokens=TokenPairs(one, np.zeros(n), top1, np.ones(n)),
                        lengths=LengthPairs(base_len, cand_len), coverage=TokenCoverage(True, n, n),
                        rates=(RatePairs("truncation", np.zeros(n), np.r_[np.zeros(n - 1), 1.0]),),
                        **_ok_requests(n))
    v = decide_sequence(GatePolicy(), [(n, inputs)], 0, planned=[124, 252, 511, 1038, 2108])
    for c in v.criteria:
        if c.status == "not_evaluated":
            continue
        assert c.ci_low is not None and c.ci_high is not None, c.label
        assert np.isfinite(c.ci_low) and np.isfinite(c.ci_high), (c.label, c.ci_low, c.ci_high)
    assert v.verdict == "INCONCLUSIVE" and v.reason.startswith("not decided: broken_share"), v.reason
    kl = _by_name(v)["kl_excess"]
    assert kl.status == "pass" and kl.ci_high < 0.012 and kl.level == pytest.approx(0.0138, abs=2e-4)
    tail = _by_name(v)["broken_share"]
    assert 0.03 < tail.ci_high < 0.05 and tail.n_more is not None and 250 < tail.n + tail.n_more < 450
    big = 511
    many = GateInputs(accuracy=(_accuracy(big, 0, 0),), tokens=TokenPairs(np.r_[one, np.zeros(big - n)], np.zeros(big),
                                                                       np.r_[top1, np.ones(big - n)], np.ones(big)),
                      lengths=LengthPairs(np.r_[base_len, base_len, base_len, base_len, base_len[:big - 4 * n]],
                                          np.r_[cand_len, base_len, base_len, base_len, base_len[:big - 4 * n]]),
                      coverage=TokenCoverage(True, big, big), **_ok_requests(big))
    assert decide_sequence(GatePolicy(), [(n, inputs), (252, inputs), (big, many)], 0,
                           planned=[124, 252, 511, 1038, 2108]).verdict == "PASS"
