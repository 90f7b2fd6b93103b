"""kvqual.stats against published values, scipy/statsmodels, brute force and simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import stats
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.proportion import proportion_confint

from kvqual import stats as st

# Cavo et al. 2012 paired table [[59, 6], [16, 80]] (Fagerland, Lydersen & Laake,
# "Statistical Analysis of Contingency Tables", ch. 8): first = candidate, second = baseline.
CAVO = st.PairedCounts(a=59, b=16, c=6, d=80)


def test_paired_counts_from_arrays() -> None:
    base = [1, 1, 0, 0, 1]
    cand = [1, 0, 1, 0, 1]
    assert st.paired_counts(base, cand) == st.PairedCounts(a=2, b=1, c=1, d=1)
    with pytest.raises(ValueError):
        st.paired_counts([1, 0], [1])


def test_tango_ci_matches_published_cavo_example() -> None:
    ci = st.tango_ci(CAVO)
    assert ci.estimate == pytest.approx(-0.0621, abs=5e-5)
    assert ci.low == pytest.approx(-0.1240, abs=5e-5)
    assert ci.high == pytest.approx(-0.0054, abs=5e-5)


def test_newcombe_method10_matches_published_cavo_example() -> None:
    ci = st.newcombe_ci(CAVO)
    assert ci.low == pytest.approx(-0.1186, abs=5e-5)
    assert ci.high == pytest.approx(-0.0046, abs=5e-5)


def test_tango_z_is_zero_at_estimate_and_ci_inverts_it() -> None:
    assert st.tango_z(CAVO, CAVO.difference) == pytest.approx(0.0, abs=1e-12)
    ci = st.tango_ci(CAVO, level=0.90)
    assert st.tango_z(CAVO, ci.low) == pytest.approx(stats.norm.ppf(0.95), abs=1e-6)
    assert st.tango_z(CAVO, ci.high) == pytest.approx(-stats.norm.ppf(0.95), abs=1e-6)


def test_tango_ci_without_discordant_pairs_is_finite_and_contains_zero() -> None:
    ci = st.tango_ci(st.PairedCounts(a=30, b=0, c=0, d=20))
    assert ci.low < 0 < ci.high
    assert -0.2 < ci.low and ci.high < 0.2


@pytest.mark.parametrize("b,c", [(16, 6), (0, 5), (3, 3), (0, 0), (40, 20)])
def test_mcnemar_exact_matches_statsmodels(b: int, c: int) -> None:
    expected = mcnemar([[10, c], [b, 10]], exact=True).pvalue if b + c else 1.0
    assert st.mcnemar_exact_p(b, c) == pytest.approx(expected, rel=1e-12)


def test_noninferiority_p_agrees_with_one_sided_bound() -> None:
    for margin in (0.05, 0.10, 0.15, 0.20):
        ni = st.paired_noninferiority(CAVO, margin, alpha=0.05)
        assert (ni.pvalue < 0.05) == (ni.lower > -margin)
    assert st.paired_noninferiority(CAVO, 0.20).noninferior
    assert not st.paired_noninferiority(CAVO, 0.05).noninferior


@pytest.mark.parametrize("method", ["tango", "newcombe"])
def test_paired_proportion_ci_coverage_by_simulation(method: str) -> None:
    rng = np.random.default_rng(7)
    probs = np.array([0.55, 0.08, 0.04, 0.33])  # a, b, c, d cell probabilities
    true_diff = probs[2] - probs[1]
    fn = st.tango_ci if method == "tango" else st.newcombe_ci
    hits, sims = 0, 1000
    for table in rng.multinomial(120, probs, size=sims):
        ci = fn(st.PairedCounts(*map(int, table)))
        hits += ci.low <= true_diff <= ci.high
    coverage = hits / sims
    assert 0.93 <= coverage <= 0.975, coverage  # nominal 0.95, MC SE ≈ 0.007


def test_mean_ci_plain_equals_t_interval() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(0.3, 1.0, 40)
    m = st.mean_ci(x)
    lo, hi = stats.t.interval(0.95, 39, loc=x.mean(), scale=stats.sem(x))
    assert (m.low, m.high) == pytest.approx((lo, hi), rel=1e-12)
    assert m.se == pytest.approx(math.sqrt(x.var(ddof=1) / 40))


def test_cluster_robust_se_matches_statsmodels_cluster_ols() -> None:
    rng = np.random.default_rng(2)
    groups = np.repeat(np.arange(15), 4)
    x = rng.normal(size=15)[groups] + rng.normal(size=60)
    m = st.mean_ci(x, clusters=groups)
    fit = sm.OLS(x, np.ones(60)).fit(cov_type="cluster", cov_kwds={"groups": groups, "use_correction": False})
    assert m.se == pytest.approx(float(fit.bse[0]) * math.sqrt(15 / 14), rel=1e-10)
    assert m.df == 14 and m.n_clusters == 15
    assert m.se > st.mean_ci(x).se  # positively correlated clusters widen the interval


def test_paired_mean_diff_uses_cand_minus_base() -> None:
    res = st.paired_mean_diff([1.0, 2.0, 3.0], [2.0, 4.0, 3.5])
    assert res.estimate == pytest.approx((1 + 2 + 0.5) / 3)


def test_paired_bootstrap_close_to_t_and_reproducible() -> None:
    x = np.random.default_rng(3).normal(1.0, 2.0, 400)
    a = st.paired_bootstrap_ci(x, np.random.default_rng(9))
    b = st.paired_bootstrap_ci(x, np.random.default_rng(9))
    t = st.mean_ci(x)
    assert a == b
    assert a.low == pytest.approx(t.low, abs=0.05) and a.high == pytest.approx(t.high, abs=0.05)


def test_cluster_bootstrap_is_wider_for_correlated_clusters() -> None:
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(20), 10)
    x = rng.normal(size=20)[groups] + 0.3 * rng.normal(size=200)
    naive = st.paired_bootstrap_ci(x, np.random.default_rng(0), method="percentile")
    clustered = st.paired_bootstrap_ci(x, np.random.default_rng(0), clusters=groups, method="percentile")
    assert clustered.high - clustered.low > 2 * (naive.high - naive.low)


def test_sample_size_formula() -> None:
    # (1.6449 + 0.8416)^2 * 0.1 / 0.05^2 = 247.3 → 248
    assert st.sample_size(0.1, 0.05, alpha=0.05, power=0.8) == 248
    assert st.n_more_to_decide(0.0, math.sqrt(0.1), 100, -0.05, power=0.8) == 148
    assert st.n_more_to_decide(-0.05, 1.0, 100, -0.05) is None
    assert st.n_more_to_decide(0.5, 0.1, 100, 0.0) == 0


def test_ratio_of_means_exact_and_zero_lengths() -> None:
    base = np.array([0.0, 10.0, 20.0, 30.0])
    ci, se = st.ratio_of_means_ci(base, 2 * base)
    assert ci.estimate == pytest.approx(2.0) and se == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError):
        st.ratio_of_means_ci(np.zeros(3), np.ones(3))


def test_ratio_of_means_coverage_by_simulation() -> None:
    rng = np.random.default_rng(5)
    hits, sims = 0, 400
    for _ in range(sims):
        mu = rng.lognormal(5, 0.6, 150)
        base, cand = mu * rng.lognormal(0, 0.3, 150), 1.1 * mu * rng.lognormal(0, 0.3, 150)
        ci, _ = st.ratio_of_means_ci(base, cand)
        hits += ci.low <= 1.1 <= ci.high
    assert 0.92 <= hits / sims <= 0.98


def test_wilcoxon_and_ks_match_scipy() -> None:
    rng = np.random.default_rng(6)
    base = rng.poisson(100, 60).astype(float)
    cand = base + rng.normal(3, 5, 60).round()
    w = st.wilcoxon_signed_rank(base, cand)
    assert w.pvalue == pytest.approx(stats.wilcoxon(cand - base).pvalue)
    assert st.wilcoxon_signed_rank(base, base).pvalue == 1.0
    assert st.ks_two_sample(base, cand).pvalue == pytest.approx(stats.ks_2samp(base, cand).pvalue)


def _walsh(x: np.ndarray) -> np.ndarray:
    i, j = np.triu_indices(x.size)
    return np.sort((x[i] + x[j]) / 2)


@pytest.mark.parametrize("seed,ints", [(0, False), (1, True), (2, True)])
def test_hodges_lehmann_matches_brute_force_walsh_averages(seed: int, ints: bool) -> None:
    rng = np.random.default_rng(seed)
    d = rng.integers(-5, 9, 57).astype(float) if ints else rng.normal(2, 3, 57)
    w = _walsh(d)
    hl = st.hodges_lehmann(d, level=0.95)
    assert hl.estimate == pytest.approx(np.median(w))
    n, m = d.size, w.size
    k = int(math.floor(m / 2 - 1.959964 * math.sqrt(n * (n + 1) * (2 * n + 1) / 24)))
    assert (hl.low, hl.high) == pytest.approx((w[k - 1], w[m - k]))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ks_gap_is_scipys_statistic_with_the_delta_method_se_at_its_maximiser(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.integers(1, 60, 150).astype(float)
    cand = base.copy()
    moved = rng.random(150) < 0.4
    cand[moved] = rng.integers(1, 120, int(moved.sum()))
    d, se, t = st.ks_gap(base, cand)
    assert d == pytest.approx(stats.ks_2samp(base, cand).statistic)
    z = (base <= t).astype(float) - (cand <= t).astype(float)
    assert abs(z.mean()) == pytest.approx(d)  # the gap at t* is the KS distance
    assert se == pytest.approx(z.std(ddof=1) / math.sqrt(z.size))  # plain SE of the mean of z
    clusters = np.repeat(np.arange(75), 2).astype(str)  # two units per cluster: CR1 SE of z's mean
    _, se_c, _ = st.ks_gap(base, cand, clusters)
    sums = np.bincount(np.repeat(np.arange(75), 2), weights=z - z.mean())
    assert se_c == pytest.approx(math.sqrt(75 / 74 * np.sum(sums**2) / 150**2))


def test_ks_gap_of_identical_arms_is_zero_and_hand_computed_on_a_small_case() -> None:
    x = np.array([10.0, 20.0, 30.0, 40.0])
    assert st.ks_gap(x, x)[:2] == (0.0, 0.0)
    d, se, t = st.ks_gap(x, np.array([10.0, 20.0, 300.0, 400.0]))  # F_base(40) = 1, F_cand(40) = 0.5
    assert (d, t) == (0.5, 40.0)  # the gap is 0.25 at 30, 0.5 at 40, shrinking after
    assert se == pytest.approx(np.std([0, 0, 1, 1], ddof=1) / 2)  # z = 1[base ≤ 40] − 1[cand ≤ 40]: 0, 0, 1, 1
    with pytest.raises(ValueError):
        st.ks_gap(x, x[:3])


def test_hodges_lehmann_textbook_shift() -> None:
    # differences symmetric about 3 → HL estimate exactly 3
    assert st.hodges_lehmann([1.0, 2.0, 3.0, 4.0, 5.0]).estimate == 3.0


def test_holm_matches_statsmodels() -> None:
    p = np.array([0.01, 0.04, 0.03, 0.5, 0.002, 0.2])
    expected = multipletests(p, method="holm")[1]
    assert st.holm_adjust(p) == pytest.approx(expected)
    assert st.holm_adjust([]).size == 0


@pytest.mark.parametrize("k,n", [(0, 50), (1, 300), (7, 120), (50, 50)])
def test_single_proportion_cis_match_statsmodels(k: int, n: int) -> None:
    cp = st.clopper_pearson_ci(k, n)
    wi = st.wilson_ci(k, n)
    assert (cp.low, cp.high) == pytest.approx(proportion_confint(k, n, method="beta"), abs=1e-10)
    assert (wi.low, wi.high) == pytest.approx(proportion_confint(k, n, method="wilson"), abs=1e-10)


def test_hall_transform_is_inverted_exactly_and_corrects_toward_the_skew() -> None:
    from kvqual.stats import cluster_skewness, hall_inverse, hall_transform

    for t in (-3.0, -1.0, 0.0, 0.5, 2.5):
        for skew in (-1.5, 0.0, 2.0):
            assert hall_inverse(hall_transform(t, skew, 40), skew, 40) == pytest.approx(t, abs=1e-9)
    assert hall_transform(-2.0, 0.0, 40) == -2.0  # no skew: the plain t statistic
    # right skew: a mean far below the bound is less significant than t says (the upper bound widens)
    assert hall_transform(-2.0, 2.0, 40) > -2.0
    x = np.random.default_rng(3).lognormal(0, 1, 500)
    assert cluster_skewness(x) == pytest.approx(float(stats.skew(x, bias=False)))
    assert cluster_skewness(np.r_[x, x], np.r_[np.arange(500), np.arange(500)]) == pytest.approx(cluster_skewness(x))


def test_betting_bound_is_finite_where_nearly_nothing_varies() -> None:
    """The GPU A/A: 123 of 124 per-item values exactly 0. The bound exists; with no spread it is
    about cap·log(1/α)/(c·n) (the bets grow the capital by 1 + c·m/(cap − m) per item at most), and
    unlike a scale-free statistic it depends on how much the one item differs, not only that it does."""
    level, cap = 0.0193, 0.12
    zeros = st.UpperBet(np.zeros(124), cap, level=level).upper()
    assert math.isfinite(zeros) and zeros == pytest.approx(cap * math.log(1 / level) / (st.BET_TRUNCATION * 124), rel=0.03)
    bounds = [st.UpperBet(np.r_[np.zeros(123), v], cap, level=level).upper() for v in (1e-6, 1e-4, 4e-3, 0.1)]
    assert all(math.isfinite(b) for b in bounds) and bounds == sorted(bounds) and bounds[-1] > bounds[0] * 1.2
    assert bounds[0] == pytest.approx(zeros, rel=1e-3)  # an item 1e-6 apart weighs as little as it differs
    with pytest.raises(ValueError, match="above the cap"):
        st.UpperBet(np.r_[0.0, 0.2], cap)


def test_betting_bound_inverts_its_test_and_ignores_cluster_copies() -> None:
    rng = np.random.default_rng(11)
    x = np.minimum(rng.lognormal(-5.5, 1.0, 300), 0.12) - rng.gamma(0.5, 0.001, 300)  # excess over a floor: some < 0
    bet = st.UpperBet(x, 0.12, level=0.05)
    upper = bet.upper()
    assert x.mean() < upper < 0.12
    assert bet.p_value(upper) == pytest.approx(0.05, rel=1e-6)
    assert bet.p_value(upper * 1.05) < 0.05 < bet.p_value(upper * 0.95)
    # a unit sent twice (two repeats in one cluster) is still one unit of evidence
    twice = st.UpperBet(np.repeat(x, 2), 0.12, np.repeat(np.arange(300), 2), level=0.05)
    assert twice.upper() == pytest.approx(upper, rel=1e-9)


@pytest.mark.parametrize("kind", ["bernoulli", "lognormal"])
def test_betting_bound_covers_the_mean_at_any_skew(kind: str) -> None:
    """Ville's inequality: the bound is below the true mean in at most α of samples, for any values
    ≤ cap. Checked on the worst case for a bounded mean (two points, 0 and the cap, rare) and on a
    heavy right skew, at n = 60, 1,500 samples each (Monte Carlo SE ≈ 0.006 at 0.05)."""
    rng = np.random.default_rng(12)
    cap, n, sims, level = 1.0, 60, 1500, 0.05
    if kind == "bernoulli":
        truth, draw = 0.03, lambda: (rng.random(n) < 0.03) * cap
    else:
        raw = rng.lognormal(-4.0, 1.5, 2_000_000)
        truth, draw = float(np.minimum(raw, cap).mean()), lambda: np.minimum(rng.lognormal(-4.0, 1.5, n), cap)
    below = sum(st.UpperBet(draw(), cap, level=level).upper() < truth for _ in range(sims))
    assert below / sims <= level + 0.01


def test_stratified_score_test_is_tango_in_one_stratum_and_holds_its_size_at_the_margin() -> None:
    t = st.PairedCounts(59, 6, 16, 80)  # the Cavo et al. table: the stratified test of one stratum is Tango's
    assert st.stratified_score_z([t], [1.0], -0.05) == pytest.approx(st.tango_z(t, -0.05))
    ci, tango = st.stratified_score_ci([t], [1.0], 0.95), st.tango_ci(t, 0.95)
    assert (ci.low, ci.high) == pytest.approx((tango.low, tango.high), abs=1e-9)
    # Tango's closed-form restricted MLE is the constrained multinomial MLE (checked numerically)
    from scipy import optimize as opt
    a, b, c, d = 40, 9, 3, 48
    d0 = -0.05

    def nll(q21: float) -> float:
        q12 = q21 + d0
        rest = 1 - q12 - q21
        return -(b * math.log(q21) + c * math.log(q12) + (a + d) * math.log(rest))

    q = opt.minimize_scalar(nll, bounds=(-d0 + 1e-9, (1 - d0) / 2 - 1e-9), method="bounded",
                            options={"xatol": 1e-12}).x
    assert st.tango_unit_variance(st.PairedCounts(a, b, c, d), d0) == pytest.approx(2 * q + d0 * (1 - d0), rel=1e-6)
    # size at the margin: two suites whose true difference is exactly −5 points, 248 items
    rng = np.random.default_rng(13)
    sims, rejected = 2000, 0
    for _ in range(sims):
        tables = []
        for n, p_b in ((100, 0.08), (148, 0.06)):  # right→wrong p_b, wrong→right p_b − 0.05
            cells = rng.multinomial(n, [0.45, p_b, p_b - 0.05, 0.55 - 2 * p_b + 0.05])
            tables.append(st.PairedCounts(*[int(k) for k in cells]))
        rejected += st.norm_sf(st.stratified_score_z(tables, [100 / 248, 148 / 248], -0.05)) < 0.05
    assert rejected / sims <= 0.05 + 0.012


def test_generation_metrics_report_length_quantiles_and_distinct2():
    from kvqual.judge.metrics import generation_metrics
    from kvqual.records import Sample

    def s(i, text, n):
        return Sample(suite="s", id=f"i{i}", repeat=0, text=text, completion_tokens=n, finish_reason="stop",
                      error=None)

    base = [s(i, "alpha beta gamma delta", 10 + i) for i in range(10)]
    cand = [s(i, "alpha beta alpha beta" if i < 5 else "alpha beta gamma delta", 10 + i + (90 if i == 9 else 0))
            for i in range(10)]
    g = generation_metrics(list(zip(base, cand)))
    assert (g["len_base_p50"], g["len_cand_p50"]) == (14.5, 14.5)
    assert g["len_base_p99"] == 18.91 and g["len_cand_p99"] == 18 + 0.91 * (109 - 18)  # numpy's linear rule
    # distinct-2: base 3/3 everywhere; cand 2/3 on five outputs ("alpha beta" twice), 1 on the rest
    assert g["distinct2_base"] == 1.0 and g["distinct2_cand"] == round((5 * 2 / 3 + 5) / 10, 6)
    assert g["distinct2_diff"] == round(-1 / 6, 6) and g["distinct2_n"] == 10
    lo, hi = g["distinct2_diff_ci"]
    assert lo < g["distinct2_diff"] < hi < 0


def test_items_that_send_the_same_prompt_are_one_cluster():
    """A user suite that asks one question twice (or an item sent with --repeats) is one unit of
    evidence: its samples share a cluster, by what they sent, not by their ids."""
    from kvqual.judge.arms import cluster_id
    from kvqual.records import Item, Sample

    a, b = Item(id="q1", suite="s", prompt="What is 2 + 2?"), Item(id="q7", suite="s", prompt="What is 2 + 2?")
    c = Item(id="q2", suite="s", prompt="What is 3 + 3?")
    chat = Item(id="m1", suite="s", messages=({"role": "user", "content": "What is 2 + 2?"},))
    assert a.prompt_hash == b.prompt_hash != c.prompt_hash and chat.prompt_hash != a.prompt_hash
    sample = lambda item: Sample(id=item.id, suite=item.suite, repeat=0, text="4", finish_reason="stop",  # noqa: E731
                                 completion_tokens=1, error=None, prompt_hash=item.prompt_hash)
    assert cluster_id(sample(a)) == cluster_id(sample(b)) != cluster_id(sample(c))
    # a shared context still comes first; a run written before prompts were hashed falls back to the item
    assert cluster_id(Sample(id="q1", suite="s", repeat=0, text="4", finish_reason="stop", completion_tokens=1,
                             error=None, context_id="doc3", prompt_hash=a.prompt_hash)) == "ctx:doc3"
    assert cluster_id(Sample(id="q1", suite="s", repeat=0, text="4", finish_reason="stop", completion_tokens=1,
                             error=None)) == "item:s\x00q1"
