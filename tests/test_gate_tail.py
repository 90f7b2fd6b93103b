"""The tail criterion (gate/tail.py), the token means' fixed cap and seeded order (gate/tokens.py), the
running betting process (stats/betting.py) and run health judged as the other criteria are."""

import math

import numpy as np
import pytest

from kvqual import stats as st
from kvqual.gate import (AccuracyPairs, BrokenUnits, GateInputs, GatePolicy, RequestCounts, TokenCoverage, TokenPairs,
                         UnusableAnswers, decide, decide_sequence)
from kvqual.gate import criteria as cr
from kvqual.gate.tail import broken_share, broken_units, units_to_bound

RNG = np.random.default_rng
PLAN = [124, 252, 511, 1038, 2108]


def _share(cand, floor=None, **kw):
    cand = np.asarray(cand, bool)
    floor = np.zeros(cand.size, bool) if floor is None else np.asarray(floor, bool)
    return broken_share(BrokenUnits(cand, floor, **kw), GatePolicy(), 0.05, 8)


def test_units_to_bound_is_the_betting_arithmetic():
    # log(1/α) / log(1 + 0.75·π/(1 − π)): the units with none broken at which the bound reaches π
    assert units_to_bound(0.01, 0.05) == math.ceil(math.log(20) / math.log1p(0.75 * 0.01 / 0.99)) == 397
    assert units_to_bound(0.02, 0.05) == 198
    assert units_to_bound(0.01, 0.05, broken=2, seen=100) is None  # 2% seen: the bound never reaches 1%


def test_no_broken_prompt_passes_only_where_the_sample_can_bound_one_percent():
    early = _share(np.zeros(124))
    assert early.status == "inconclusive" and 0.03 < early.ci_high < 0.045  # "at most ~4% broken at 124 items"
    assert early.n_more is not None and early.n + early.n_more == units_to_bound(0.01, 0.05)
    assert _share(np.zeros(396)).status == "inconclusive"
    late = _share(np.zeros(397))
    assert late.status == "pass" and late.ci_high < 0.01 and "bounds the share the candidate broke at" in late.detail


def test_three_percent_broken_fails_and_the_floor_is_subtracted():
    cand = RNG(1).random(1000) < 0.03
    c = _share(cand)
    assert c.p_fail < 1e-4 and c.ci_low > 0.01 and c.estimate == pytest.approx(cand.mean())
    # the same prompts broken in the A/A floor too: the baseline breaks them itself, no excess
    same = _share(cand, floor=cand)
    assert same.estimate == 0 and same.p_fail > 0.5


def test_a_broken_unit_inside_a_shared_context_breaks_the_context():
    clusters = np.array([f"ctx:{i // 4}" for i in range(400)], dtype=object)
    cand = np.zeros(400, bool)
    cand[[1, 2, 3]] = True  # three prompts of one context: one broken independent unit, not three
    c = _share(cand, clusters=clusters)
    assert c.n == 100 and c.unit == "contexts" and c.estimate == pytest.approx(0.01)


def test_the_order_bet_on_is_the_seeded_rank_not_the_order_given():
    """Betting needs an order fixed before the data: a suite-sorted input with its ranks gives the
    p-value of the seeded order; the same values in another order (no rank) give another."""
    rng = RNG(3)
    n = 500
    kl = rng.lognormal(np.log(0.004), 1.0, n)
    rank = rng.permutation(n)
    seeded_kl = np.empty(n)
    seeded_kl[rank] = kl  # the values in the seeded order
    ref = cr.token_excess("kl_excess", 0.012, seeded_kl, np.zeros(n), None, 0.05, "", 8, 0.12, alpha=0.05)
    by_suite = np.argsort(kl)  # sorted "by id": the worst order for a bettor that sizes bets on the past
    got = cr.token_excess("kl_excess", 0.012, kl[by_suite], np.zeros(n), None, 0.05, "", 8, 0.12,
                          rank=rank[by_suite], alpha=0.05)
    assert got.p_pass == pytest.approx(ref.p_pass) and got.ci_high == pytest.approx(ref.ci_high)
    unranked = cr.token_excess("kl_excess", 0.012, kl[by_suite], np.zeros(n), None, 0.05, "", 8, 0.12, alpha=0.05)
    assert unranked.p_pass != pytest.approx(ref.p_pass)


def test_the_cap_is_fixed_before_the_data_and_the_mean_printed_is_the_one_bounded():
    n = 300
    kl = np.full(n, 0.002)
    kl[:3] = 2.8  # 1% of prompts broken badly: the raw mean is 0.030, far above the 0.012 bound
    c = cr.token_excess("kl_excess", 0.012, kl, np.zeros(n), None, 0.05, "", 8, 0.12, alpha=0.05)
    capped = (np.minimum(kl, 0.12)).mean()
    assert c.estimate == pytest.approx(capped) and c.ci_high >= capped
    assert "3 units above the cap" in c.detail and f"{kl.mean():.4g}" in c.detail
    # the tail criterion is what sees those three prompts
    tail = _share(kl > GatePolicy().broken_kl)
    assert tail.estimate == pytest.approx(0.01) and tail.status != "pass"


def test_the_running_process_is_one_path_whatever_follows():
    rng = RNG(5)
    x = rng.lognormal(np.log(0.003), 1.0, 600)
    short = st.UpperBet(x[:200], 0.12, None, 0.05, running=True)
    long = st.UpperBet(x, 0.12, None, 0.05, running=True)
    assert np.allclose(short.lam, long.lam[:200])  # bets sized by the past only, never by n
    assert long.log_capital(0.012) >= short.log_capital(0.012)  # the highest point of a longer path
    fixed = st.UpperBet(x[:200], 0.12, None, 0.05)
    assert not np.allclose(fixed.lam, st.UpperBet(x, 0.12, None, 0.05).lam[:200])  # the per-look bets depend on n


def test_the_running_tail_holds_its_level_over_every_look_with_the_truth_on_the_bound():
    """Monte Carlo: every unit broken with probability π = 1% (the bound), looks at the default plan's
    sizes over one seeded order: the share of compares the criterion PASSes at any look stays ≤ α."""
    rng = RNG(11)
    sims, passes = 400, 0
    for _ in range(sims):
        x = rng.random(PLAN[-1]) < 0.01
        # the highest point of the whole path: a PASS at any look (or between) is counted
        passes += st.UpperBet(x.astype(float), 1.0, None, 0.05, running=True).log_capital(0.01) >= math.log(20)
    rate = passes / sims
    assert rate <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / sims), rate


def test_unusable_answers_are_broken_units_beside_the_token_pairs():
    tp = TokenPairs(np.r_[np.zeros(98), 0.5, 0.0], np.zeros(100), np.ones(100), np.ones(100))
    bu = broken_units(tp, UnusableAnswers(np.array(["item:a", "item:b"], dtype=object)), 0.1)
    assert bu.cand.sum() == 3 and bu.unusable.sum() == 2 and bu.floor.sum() == 0 and bu.cand.size == 102
    c = broken_share(bu, GatePolicy(), 0.05, 8)
    assert "2 of them" not in c.detail and "an answer that is not data: 2" in c.detail


def test_failed_requests_are_judged_as_the_other_criteria():
    """A server failing 0.5% of requests shows 2 failures in the first 124 (1.6% > 1%): not shown
    above the bound, so no exit 4; it blocks PASS at that look, and a later look decides."""
    pol = GatePolicy()
    two = cr.failed("candidate", RequestCounts(2, 124), pol, 0.0138)
    assert two.status == "inconclusive" and not two.infrastructure and "more requests decide" in two.detail
    many = cr.failed("candidate", RequestCounts(12, 124), pol, 0.0138)
    assert many.infrastructure and "shown above" in many.detail
    assert cr.failed("candidate", RequestCounts(5, 1000), pol, 0.0138).status == "pass"


def _inputs(n, cand_failed=0, unusable=0):
    acc = AccuracyPairs("s", np.r_[np.ones(n // 2, bool), np.zeros(n - n // 2, bool)],
                        np.r_[np.ones(n // 2, bool), np.zeros(n - n // 2, bool)])
    return GateInputs(accuracy=(acc,), tokens=TokenPairs(np.zeros(n), np.zeros(n), np.ones(n), np.ones(n)),
                      coverage=TokenCoverage(True, n, n), base_requests=RequestCounts(0, n),
                      cand_requests=RequestCounts(cand_failed, n),
                      unusable=UnusableAnswers(np.array([f"item:x{i}" for i in range(unusable)], dtype=object))
                      if unusable else None)


def test_an_undecided_failure_rate_at_the_last_planned_look_is_infrastructure_not_more_items():
    v = decide_sequence(GatePolicy(), [(500, _inputs(500, cand_failed=7))], 0, planned=[500])
    assert v.exit_code == 4 and v.infrastructure, v.reason
    # not the last look: the compare goes on
    w = decide_sequence(GatePolicy(), [(500, _inputs(500, cand_failed=7))], 0, planned=[500, 1000])
    assert w.verdict == "INCONCLUSIVE" and not w.infrastructure


def test_a_candidate_answering_nan_on_three_percent_fails_instead_of_exit_4():
    v = decide(GatePolicy(looks=1), _inputs(1000, unusable=30), RNG(0))
    assert v.verdict == "FAIL" and v.exit_code == 1 and "broken_share" in v.reason, v.reason


def test_unusable_answer_reads_the_messages_kvqual_really_stores():
    """Built from what the code produces: client.check_finite's and bodies.decode_json's errors, classified
    by retry.classify (what runner.request_one stores), and the teacher-forcing reason forcing writes."""
    from kvqual.bodies import check_model, decode_json
    from kvqual.client import check_finite
    from kvqual.errors import InvalidResponse
    from kvqual.forced import FAILED
    from kvqual.records import TokenLogprobs, unusable_answer
    from kvqual.retry import classify

    def stored(fn):
        with pytest.raises(InvalidResponse) as exc:
            fn()
        return classify(exc.value).message

    nan = stored(lambda: check_finite(TokenLogprobs((" 4",), (float("nan"),), ({" 4": float("nan")},)), "http://s/v1"))
    body = stored(lambda: decode_json(b'{"choices": [{"logprobs": {"token_logprobs": [NaN]}}]}', "http://s/v1"))
    other = stored(lambda: check_model("m", {"model": "another"}, "http://s/v1"))
    assert unusable_answer(nan) and unusable_answer(body) and unusable_answer(f"{FAILED}: {nan}")
    assert not unusable_answer(other)  # another model answering is the config's fault, not the candidate's output
    assert not unusable_answer("connection error: Server disconnected") and not unusable_answer("HTTP 500: boom")
    assert not unusable_answer(None)
