"""kvqual.gate: policy validation, criteria statuses, verdict rules and report JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvqual.errors import ConfigError
from kvqual.gate import (
    AccuracyPairs, GateInputs, GatePolicy, LengthPairs, RequestCounts, TokenPairs, Verdict, decide,
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


def test_large_accuracy_regression_fails_with_flips_reported() -> None:
    inputs = GateInputs(accuracy=(_accuracy(300, 60, 10),), **_ok_requests(300))
    v = decide(GatePolicy(), inputs, RNG(0))
    acc = _by_name(v)["accuracy[s]"]
    assert v.verdict == "FAIL" and v.exit_code == 1
    assert acc.status == "fail" and acc.estimate == pytest.approx(-50 / 300)
    assert acc.ci_high < -0.05 and acc.p_fail_holm < 0.05
    assert "right→wrong 60" in acc.detail and "wrong→right 10" in acc.detail


def test_small_sample_straddling_margin_is_inconclusive_with_n_more() -> None:
    inputs = GateInputs(accuracy=(_accuracy(60, 5, 3),), **_ok_requests(60))
    v = decide(GatePolicy(), inputs, RNG(0))
    acc = _by_name(v)["accuracy[s]"]
    assert v.verdict == "INCONCLUSIVE" and v.exit_code == 3
    assert acc.status == "inconclusive" and acc.ci_low < -0.05 < acc.ci_high
    assert acc.n_more is not None and acc.n_more > 0 and "accuracy[s]" in v.reason


def test_no_flips_on_a_small_suite_still_asks_for_a_real_number_of_items() -> None:
    # 30 items, no flips: Tango's 90% interval is about ±0.083, so -0.05 is not shown; the
    # observed flip rate (0) must not promise "0 more items"
    inputs = GateInputs(accuracy=(_accuracy(30, 0, 0),), **_ok_requests(30))
    acc = _by_name(decide(GatePolicy(), inputs, RNG(0)))["accuracy[s]"]
    assert acc.status == "inconclusive" and acc.ci_low < -0.05
    assert 30 <= acc.n_more <= 200


def test_kl_and_top1_beyond_floor_fail_at_e5m2_level() -> None:
    v = decide(GatePolicy(), GateInputs(tokens=_tokens(200, kl_shift=0.054, top1_shift=0.12)), RNG(0))
    c = _by_name(v)
    assert c["kl_excess"].status == "fail" and c["top1_loss"].status == "fail" and v.verdict == "FAIL"
    v2 = decide(GatePolicy(), GateInputs(tokens=_tokens(200, kl_shift=0.016, top1_shift=0.054)), RNG(0))
    c2 = _by_name(v2)
    assert c2["kl_excess"].status == "pass" and c2["top1_loss"].status == "pass"


def test_bootstrap_option_agrees_with_t_on_clear_cases() -> None:
    pol = GatePolicy(bootstrap_resamples=999)
    assert _by_name(decide(pol, GateInputs(tokens=_tokens(200, kl_shift=0.054)), RNG(0)))["kl_excess"].status == "fail"
    assert _by_name(decide(pol, GateInputs(tokens=_tokens(200)), RNG(0)))["kl_excess"].status == "pass"


def test_length_blowup_fails_and_small_drift_passes() -> None:
    assert _by_name(decide(GatePolicy(), GateInputs(lengths=_lengths(200, 1.5)), RNG(0)))["length_ratio"].status == "fail"
    assert _by_name(decide(GatePolicy(), GateInputs(lengths=_lengths(200, 0.6)), RNG(0)))["length_ratio"].status == "fail"
    assert _by_name(decide(GatePolicy(), GateInputs(lengths=_lengths(200, 1.02)), RNG(0)))["length_ratio"].status == "pass"


def test_missing_parts_are_not_evaluated_and_do_not_pass() -> None:
    v = decide(GatePolicy(), GateInputs(), RNG(0))
    assert v.verdict == "INCONCLUSIVE"
    assert all(c.status == "not_evaluated" for c in v.criteria)
    v2 = decide(GatePolicy(), GateInputs(accuracy=(_accuracy(2000, 20, 20),), **_ok_requests(2000)), RNG(0))
    c = _by_name(v2)
    assert v2.verdict == "PASS"  # no teacher forcing: token criteria reported, not required
    assert c["kl_excess"].status == "not_evaluated" and c["length_ratio"].status == "not_evaluated"


def test_too_many_failed_requests_is_never_a_pass() -> None:
    n = 2000
    good = dict(accuracy=(_accuracy(n, 20, 20),))
    v = decide(GatePolicy(), GateInputs(**good, base_requests=RequestCounts(0, n), cand_requests=RequestCounts(30, n)), RNG(0))
    assert v.verdict != "PASS" and _by_name(v)["failed_rate_candidate"].status in {"fail", "inconclusive"}
    v = decide(GatePolicy(), GateInputs(**good, base_requests=RequestCounts(60, n), cand_requests=RequestCounts(0, n)), RNG(0))
    assert v.verdict == "INCONCLUSIVE" and _by_name(v)["failed_rate_baseline"].status == "inconclusive"
    v = decide(GatePolicy(), GateInputs(**good, base_requests=RequestCounts(0, n), cand_requests=RequestCounts(400, n)), RNG(0))
    assert v.verdict == "FAIL" and _by_name(v)["failed_rate_candidate"].status == "fail"


def test_holm_adjustment_is_applied_across_criteria() -> None:
    # a lone marginal accuracy failure (p_fail just under alpha) becomes inconclusive with more criteria
    inputs_one = GateInputs(accuracy=(_accuracy(400, 50, 15),))
    p_raw = _by_name(decide(GatePolicy(), inputs_one, RNG(0)))["accuracy[s]"].p_fail
    assert 0.01 < p_raw < 0.05
    many = GateInputs(accuracy=(_accuracy(400, 50, 15), _accuracy(400, 20, 20, "t"), _accuracy(400, 21, 20, "u")))
    acc = _by_name(decide(GatePolicy(), many, RNG(0)))["accuracy[s]"]
    assert acc.p_fail_holm == pytest.approx(min(1.0, 3 * p_raw)) and acc.status != "fail"


def test_clustered_accuracy_uses_cluster_robust_interval() -> None:
    acc = _accuracy(200, 30, 10)
    clustered = AccuracyPairs("s", acc.base_correct, acc.cand_correct, clusters=np.arange(200) // 10)
    plain = _by_name(decide(GatePolicy(), GateInputs(accuracy=(acc,)), RNG(0)))["accuracy[s]"]
    wide = _by_name(decide(GatePolicy(), GateInputs(accuracy=(clustered,)), RNG(0)))["accuracy[s]"]
    assert "20 contexts" in wide.detail and (wide.ci_high - wide.ci_low) > (plain.ci_high - plain.ci_low)


def test_clustered_accuracy_without_flips_is_not_certain() -> None:
    # 24 questions on 12 documents, nothing flips: the cluster-robust SE is 0, but 24 items cannot
    # show accuracy within 5 points (the unclustered score test agrees); 480 such items can
    def verdict(n: int):
        same = np.arange(n) % 2 == 0
        pairs = AccuracyPairs("s", same, same, clusters=np.arange(n) // 2)
        return _by_name(decide(GatePolicy(), GateInputs(accuracy=(pairs,)), RNG(0)))["accuracy[s]"]

    small, large = verdict(24), verdict(480)
    assert small.status == "inconclusive" and small.ci_low < -0.05 and "floored" in small.detail
    assert small.n_more is not None and small.n_more > 24
    plain = _by_name(decide(GatePolicy(), GateInputs(accuracy=(_accuracy(24, 0, 0),)), RNG(0)))["accuracy[s]"]
    assert plain.status == "inconclusive" and small.ci_low == pytest.approx(plain.ci_low, abs=0.02)
    assert large.status == "pass"
    two_documents = verdict(4)  # t on 1 degree of freedom: the interval is clipped to [-1, 1]
    assert two_documents.ci_low == -1.0 and two_documents.ci_high == 1.0


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
    assert {c["name"] for c in data["criteria"]} >= {"accuracy", "kl_excess", "length_ratio", "failed_rate_candidate"}
