"""Each criterion: its estimate, interval, pass and fail tests, and what would decide it.

Pure functions of the gate's inputs. `level` is the one-sided level each test runs at: α for
a fixed-n compare, the sequential nominal level α′ at each look of a sequential one
(gate/sequential.py). Intervals shown are (1 − 2·level) two-sided, so each end is the
one-sided bound its pass test uses. Every SE is cluster-robust over items (or shared
contexts): repeats of an item never add independent units. docs/statistics.md.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from kvqual import stats as st
# the criterion value and the tests' shared pieces, and the token-level criteria: their own modules,
# their names here too (every criterion is `criteria.<name>`)
from kvqual.gate.criterion import (CONTEXT_PREFIX, Criterion, Direction, Role, Status, _cdf, _n_more, _quantile,
                                   _standardized, _unit, not_evaluated, one_sided)
from kvqual.gate.inputs import AccuracyPairs, CachePairs, LengthPairs, RatePairs, RequestCounts, SteadySpeed, n_clusters
from kvqual.gate.policy import GatePolicy
from kvqual.gate.tokens import TOKEN_CRITERIA, token_criteria, token_excess

__all__ = [
    "CONTEXT_PREFIX", "Criterion", "Direction", "Role", "Status", "not_evaluated", "one_sided", "token_excess",
    "TOKEN_CRITERIA", "token_criteria", "accuracy", "pooled_accuracy", "lengths", "rate_excess", "RATE_CRITERIA",
    "length_ks", "cache_path", "failed", "failures_shown_above", "speedup", "steady_speedup",
]


# ---------------------------------------------------------------- accuracy


def _cluster_counts(pairs: AccuracyPairs) -> st.PairedCounts:
    """The paired table with each cluster counted once (its units' shares of each cell)."""
    b, c = pairs.base_correct, pairs.cand_correct
    if pairs.clusters is None:
        return st.paired_counts(b, c)
    g = np.unique(pairs.clusters.astype(str), return_inverse=True)[1]
    size = np.bincount(g).astype(float)
    cell = lambda mask: float(np.sum(np.bincount(g, weights=mask.astype(float)) / size))  # noqa: E731
    return st.PairedCounts(cell(b & c), cell(b & ~c), cell(~b & c), cell(~b & ~c))  # type: ignore[arg-type]


def _score_se(counts: st.PairedCounts, level: float) -> float:
    """Tango score interval's half-width as an SE: honest where the plain SE is not (no flips → 0)."""
    ci = st.tango_ci(counts, level=1 - 2 * level)
    return (ci.high - ci.low) / (2 * st.norm_isf(level))


def _accuracy_detail(pairs: AccuracyPairs) -> str:
    counts = st.paired_counts(pairs.base_correct, pairs.cand_correct)
    n = counts.n
    return (f"base {(counts.a + counts.b) / n:.1%} → cand {(counts.a + counts.c) / n:.1%}; "
            f"flips right→wrong {counts.b}, wrong→right {counts.c}; "
            f"McNemar exact p={st.mcnemar_exact_p(counts.b, counts.c):.3g}")


def accuracy(pairs: AccuracyPairs, policy: GatePolicy, level: float, m: int, role: Role) -> Criterion:
    """Non-inferiority of cand − base accuracy at −δ in one suite: Tango score test when every
    unit is its own item; otherwise the cluster-robust paired mean with its SE floored at the
    score SE of the cluster-level table (with no flips the robust SE is 0)."""
    delta = policy.accuracy_margin
    n_units = pairs.base_correct.size
    if n_units == 0:
        return not_evaluated("accuracy", "at_least", -delta, None, "no scored pairs", pairs.suite, role)
    detail = _accuracy_detail(pairs)
    g, unit = _unit(pairs.clusters, n_units)
    if g == n_units:
        counts = st.paired_counts(pairs.base_correct, pairs.cand_correct)
        ci = st.tango_ci(counts, level=1 - 2 * level)
        zs = st.tango_z(counts, -delta)
        est = counts.difference
        score_se = (ci.high - ci.low) / (2 * st.norm_isf(level))
        sd = max(math.sqrt(max((counts.b + counts.c) / g - est**2, 0.0)), score_se * math.sqrt(g))
        return Criterion("accuracy", pairs.suite, "inconclusive", "at_least", -delta, None, est, ci.low, ci.high,
                         ci.level, st.norm_sf(zs), st.norm_cdf(zs), None, g,
                         _n_more(est, sd, g, -delta, est > -delta, level, m), detail, role, unit, level)
    if g < 2:
        return not_evaluated("accuracy", "at_least", -delta, None, detail + "; fewer than 2 independent units",
                             pairs.suite, role)
    diff = pairs.cand_correct.astype(float) - pairs.base_correct.astype(float)
    mc = st.mean_ci(diff, pairs.clusters.astype(str))
    floor = _score_se(_cluster_counts(pairs), level)
    note = f"; cluster-robust over {g} {unit}" + (" (SE floored at the cluster table's score SE)"
                                                  if floor > mc.se else "")
    crit = one_sided("accuracy", pairs.suite, "at_least", -delta, mc.estimate, max(mc.se, floor), mc.df, g, level,
                     detail + note, m, role, unit)
    # a t interval on few clusters can pass ±1; a difference of proportions cannot
    return dataclasses.replace(crit, ci_low=max(-1.0, crit.ci_low), ci_high=min(1.0, crit.ci_high))


def pooled_accuracy(all_pairs: tuple[AccuracyPairs, ...], policy: GatePolicy, level: float, m: int) -> Criterion:
    """One non-inferiority test over every scored suite, stratified by suite: Δ = Σ w_s Δ_s with w_s
    the suite's share of clusters, tested with the stratified score statistic
    (`stats.stratified_score_z`): each suite's variance taken under the null Δ_s = −δ, so the test
    keeps its size at the margin where a Wald test (variance at Δ̂) does not. A suite whose items
    share contexts enters as its cluster-level table (each cluster counted once, its units' shares of
    each cell), whose variance under the null is at least that of its cluster means; normal reference."""
    delta = policy.accuracy_margin
    usable = [p for p in all_pairs if p.base_correct.size]
    if not usable:
        return not_evaluated("accuracy", "at_least", -delta, None, "no scored suite")
    tables = [_cluster_counts(p) for p in usable]
    sizes = np.array([t.n for t in tables], float)
    weights = sizes / sizes.sum()
    z = st.stratified_score_z(tables, weights, -delta)
    ci = st.stratified_score_ci(tables, weights, 1 - 2 * level)
    var0 = sum(w * w * st.tango_unit_variance(t, -delta) / t.n for w, t in zip(weights, tables))
    G = int(round(sizes.sum()))
    counts = st.paired_counts(np.concatenate([p.base_correct for p in usable]),
                              np.concatenate([p.cand_correct for p in usable]))
    n = counts.n
    detail = (f"stratified score test over {len(usable)} suites; base {(counts.a + counts.b) / n:.1%} → cand "
              f"{(counts.a + counts.c) / n:.1%}; flips right→wrong {counts.b}, wrong→right {counts.c}; "
              f"McNemar exact p={st.mcnemar_exact_p(counts.b, counts.c):.3g}")
    units = {_unit(p.clusters, p.base_correct.size)[1] for p in usable}
    inside = ci.estimate > -delta
    return Criterion("accuracy_pooled", None, "inconclusive", "at_least", -delta, None, ci.estimate, ci.low, ci.high,
                     ci.level, st.norm_sf(z), st.norm_cdf(z), None, G,
                     _n_more(ci.estimate, math.sqrt(var0 * G), G, -delta, inside, level, m), detail, "primary",
                     "contexts" if units == {"contexts"} else "items", level)


# ---------------------------------------------------------------- lengths, rates


def _within(name: str, theta: float, se: float, df: float, lo: float, hi: float, g: int, level: float, m: int,
            detail: str, role: Role, unit: str) -> Criterion:
    """A log-scale estimate `theta` judged within [lo, hi] (ratios): two one-sided t tests for PASS,
    the doubled smaller tail for FAIL; the interval shown back on the ratio scale."""
    z_lo, z_hi = _standardized(theta - math.log(lo), se), _standardized(theta - math.log(hi), se)
    p_pass = max(1 - _cdf(z_lo, df), _cdf(z_hi, df))
    p_fail = min(1.0, 2 * min(_cdf(z_lo, df), 1 - _cdf(z_hi, df)))
    q = _quantile(level, df)
    nearest = lo if abs(theta - math.log(lo)) < abs(theta - math.log(hi)) else hi
    inside = math.log(lo) < theta < math.log(hi)
    n_more = _n_more(theta, se * math.sqrt(g), g, math.log(nearest), inside, level, m)
    return Criterion(name, None, "inconclusive", "within", lo, hi, math.exp(theta), math.exp(theta - q * se),
                     math.exp(theta + q * se), 1 - 2 * level, p_pass, p_fail, None, g, n_more, detail, role, unit, level)


def lengths(lp: LengthPairs, floor: LengthPairs | None, policy: GatePolicy, level: float, m: int) -> list[Criterion]:
    """Output length within 1 ± drift, two ways (docs/statistics.md, "Output length"):
    - `length_ratio` (primary): the geometric mean of the per-unit ratios cand/base, exp(mean log(c/b)),
      an empty output counted as 1 token; cluster-robust t on the log ratios. Each unit weighs the same,
      so the few outputs that loop to max_tokens move it as much as any other unit, not as much as
      their length;
    - `length_mean_ratio` (guard): the ratio of mean lengths (delta method on the log scale), which
      those long outputs dominate: it FAILs a candidate whose outputs run away in total, and being a
      guard, its being undecided never blocks PASS."""
    lo, hi = 1 - policy.max_length_drift, 1 + policy.max_length_drift
    g, unit = _unit(lp.clusters, lp.base.size)
    if g >= 2 and lp.base.mean() > 0 and lp.cand.mean() <= 0:  # the candidate stopped answering at all
        return [Criterion(name, None, "inconclusive", "within", lo, hi, 0.0, 0.0, 0.0, 1 - 2 * level,
                          1.0, 0.0, None, g, None, f"mean {lp.base.mean():.1f} → 0 tokens: no output at all",
                          role, unit, level)
                for name, role in (("length_ratio", "primary"), ("length_mean_ratio", "guard"))]
    if g < 2 or lp.base.mean() <= 0 or lp.cand.mean() <= 0:
        return [Criterion(name, None, "not_evaluated", "within", lo, hi, n=g, role=role,  # type: ignore[arg-type]
                          detail="fewer than 2 independent pairs or an arm with no output")
                for name, role in (("length_ratio", "primary"), ("length_mean_ratio", "guard"))]
    clusters = None if lp.clusters is None else lp.clusters.astype(str)
    df = g - 1
    logs = np.log(np.maximum(lp.cand, 1.0)) - np.log(np.maximum(lp.base, 1.0))
    se = st.mean_ci(logs, clusters).se if np.any(logs != logs[0]) else 0.0
    d = lp.cand - lp.base
    hl = st.hodges_lehmann(d, level=1 - 2 * level)
    changed = int(np.sum(logs != 0))
    detail = (f"{changed} of {logs.size} lengths differ; mean {lp.base.mean():.1f} → {lp.cand.mean():.1f} tokens; "
              f"HL shift {hl.estimate:+.1f} [{hl.low:+.1f}, {hl.high:+.1f}]; "
              f"Wilcoxon p={st.wilcoxon_signed_rank(lp.base, lp.cand).pvalue:.3g}")
    if floor is not None and floor.base.size >= 2:
        fl = np.log(np.maximum(floor.cand, 1.0)) - np.log(np.maximum(floor.base, 1.0))
        detail += f"; A/A geometric ratio {math.exp(float(fl.mean())):.3f} (n={floor.base.size})"
    geo = _within("length_ratio", float(logs.mean()), se, df, lo, hi, g, level, m, detail, "primary", unit)
    ci, se_m = st.ratio_of_means_ci(lp.base, lp.cand, clusters, level=1 - 2 * level)
    mdetail = (f"mean {lp.base.mean():.1f} → {lp.cand.mean():.1f} tokens; "
               f"KS p={st.ks_two_sample(lp.base, lp.cand).pvalue:.3g}")
    if floor is not None and floor.base.mean() > 0 and floor.cand.mean() > 0:
        mdetail += f"; A/A ratio {floor.cand.mean() / floor.base.mean():.3f} (n={floor.base.size})"
    mean = _within("length_mean_ratio", math.log(ci.estimate), se_m, df, lo, hi, g, level, m, mdetail, "guard", unit)
    return [geo, mean]


def _floor_refused(size: int, clusters: np.ndarray | None) -> str | None:
    """Why a guard takes its A/A floor as 0 (None: the floor's `size` pairs can be used): no
    replicate (fewer than 2 pairs), or pairs of one cluster, whose mean has no SE."""
    if size < 2:
        return "no A/A replicate: floor taken as 0"
    if n_clusters(clusters, size) < 2:
        return f"A/A floor on {size} pairs of one cluster (no SE): floor taken as 0"
    return None


def rate_excess(rp: RatePairs, bound: float, level: float, m: int) -> Criterion:
    """Guard: the event's rate in the candidate minus the baseline's, a plain paired difference
    (cluster-robust t), FAIL only when shown above the bound. No A/A floor is subtracted: two runs
    of one config differ by 0 in expectation, so a floor adds only its own noise (it cost a 10-point
    distinct-2 drop a fifth of its detections, docs/calibration.md); the A/A replicate's difference
    is shown beside it."""
    name = RATE_CRITERIA.get(rp.name, f"{rp.name}_excess")
    g, unit = _unit(rp.clusters, rp.base.size)
    if g < 2:
        return not_evaluated(name, "at_most", None, bound, "fewer than 2 independent pairs", role="guard")
    clusters = None if rp.clusters is None else rp.clusters.astype(str)
    d = rp.cand - rp.base
    est = float(d.mean())
    se = st.mean_ci(d, clusters).se if np.any(d != d[0]) else 0.0
    if rp.floor_base is not None and rp.floor_aa is not None and rp.floor_base.size >= 1:
        floor_txt = f"A/A difference {float((rp.floor_aa - rp.floor_base).mean()):+.3f} over {rp.floor_base.size} pairs (shown, not subtracted)"
    else:
        floor_txt = "no A/A replicate"
    if rp.name == "repeated_bigrams":  # the values are 1 − distinct-2: say it in distinct-2
        detail = f"distinct-2 base {1 - rp.base.mean():.3f} → cand {1 - rp.cand.mean():.3f}; {floor_txt}"
    else:
        detail = f"rate base {rp.base.mean():.1%} → cand {rp.cand.mean():.1%}; {floor_txt}"
    return one_sided(name, None, "at_most", bound, est, se, g - 1, g, level, detail, m, "guard", unit)


RATE_CRITERIA = {"truncation": "truncation_excess", "loop": "loop_excess", "repeated_bigrams": "distinct2_loss"}


def length_ks(lp: LengthPairs, floor: LengthPairs | None, bound: float, level: float, m: int) -> Criterion:
    """Guard: the two-sample KS distance between the arms' output-length distributions, beyond the
    same distance between the baseline and its A/A replicate on the items the replicate covers: the
    shape change a ratio of means misses (some outputs run away while others shrink). Each distance's
    SE by the delta method at its maximiser (`stats.ks_gap`); SE² = SE₁² + SE₂² as in `rate_excess`.
    FAIL only when shown above the bound. docs/statistics.md, "Free generation"."""
    name = "length_ks_excess"
    g, unit = _unit(lp.clusters, lp.base.size)
    if g < 2:
        return not_evaluated(name, "at_most", None, bound, "fewer than 2 independent pairs", role="guard")
    clusters = None if lp.clusters is None else lp.clusters.astype(str)
    d, se, t = st.ks_gap(lp.base, lp.cand, clusters)
    est, var = d, se ** 2
    fc = None if floor is None or floor.clusters is None else floor.clusters.astype(str)
    floor_txt = _floor_refused(0 if floor is None else floor.base.size, fc)
    if floor_txt is None:
        assert floor is not None
        fd, fse, ft = st.ks_gap(floor.base, floor.cand, fc)
        est -= fd
        var += fse ** 2
        floor_txt = f"A/A KS {fd:.3f} over {floor.base.size} pairs (largest at {ft:.0f} tokens)"
    detail = f"KS distance {d:.3f} over {lp.base.size} pairs (largest at {t:.0f} tokens); {floor_txt}"
    return one_sided(name, None, "at_most", bound, est, math.sqrt(var), g - 1, g, level, detail, m, "guard", unit)


def cache_path(cp: CachePairs, policy: GatePolicy, level: float, m: int) -> Criterion:
    """The cache path (docs/cache.md): within each shared context that has both, the mean value of
    its warm units minus that of its cold ones; at most `max_cache_kl_excess` over the contexts
    (one-sided t, each context one unit). A warm path that reads wrong K/V raises only its warm
    units' values; what the generation and teacher-forcing paths differ by anyway, on either arm,
    is on both sides of the contrast and cancels."""
    bound, role = policy.max_cache_kl_excess, cp.role  # type: ignore[assignment]
    if cp.values.size == 0:
        return Criterion("cache_path", None, "inconclusive", "at_most", None, bound, detail=cp.note or "no probe units",
                         role=role, unit="contexts")  # type: ignore[arg-type]
    names = cp.clusters.astype(str) if cp.clusters is not None else np.array([f"u{i}" for i in range(cp.values.size)])
    contrasts = []
    for c in np.unique(names):
        mine = names == c
        w, k = cp.values[mine & cp.warm], cp.values[mine & ~cp.warm]
        if w.size and k.size:
            contrasts.append(float(w.mean() - k.mean()))
    e = np.asarray(contrasts)
    detail = f"{cp.note}; {e.size} contexts with warm and cold units"
    if e.size < 2:
        return Criterion("cache_path", None, "inconclusive", "at_most", None, bound, n=int(e.size),
                         detail=detail + " (2 are needed)", role=role, unit="contexts")  # type: ignore[arg-type]
    se = st.mean_ci(e).se if np.any(e != e[0]) else 0.0
    return one_sided("cache_path", None, "at_most", bound, float(e.mean()), se, e.size - 1, int(e.size), level,
                     detail + "; warm − cold KL(forced ‖ generated) per context, beyond the baseline's", m,
                     role, "contexts")  # type: ignore[arg-type]


def failures_shown_above(failed: int, total: int, bound: float, level: float = 0.05) -> bool:
    """Is the share of failed requests shown above `bound` (the exact one-sided lower bound at `level`
    above it)? The one rule for stopping on failures, in the gate and while requests are sent: 2 failures
    in the first 124 requests of a server failing 0.5% are not (1.6% observed; its lower bound is 0.2%)."""
    return failed > 0 and total > 0 and st.clopper_pearson_ci(failed, total, level=1 - 2 * level).low > bound


def failed(arm: str, counts: RequestCounts, policy: GatePolicy, level: float) -> Criterion:
    """Run health, both arms alike: the share of requests that failed for the network or the server
    (after their retries) against `max_failed_rate`, judged as the other criteria are: shown above it
    (the exact lower bound at this look's level above the bound), the run is not trusted and the
    compare stops as an infrastructure fault (exit 4), never as a verdict on the candidate
    (`Verdict.infrastructure`); above it but not shown (2 failures in the first 124 requests of a server
    failing 0.5%), it blocks PASS at this look and more requests decide; at or below it, it passes.
    A candidate's answer that is not data (NaN logprobs) is no failure here: it is the candidate's
    own outcome, a broken prompt (gate/tail.py). Prompts that do not fit a server's context are not
    failures either: they are left out of both arms."""
    k, n, bound = counts.failed, counts.total, policy.max_failed_rate
    if n <= 0:
        return not_evaluated(f"failed_rate_{arm}", "at_most", None, bound, "no requests")
    ci = st.clopper_pearson_ci(k, n, level=1 - 2 * level)
    shown_above = failures_shown_above(k, n, bound, level)
    status: Status = "pass" if k / n <= bound else "inconclusive"
    detail = f"{k} of {n} requests failed"
    if shown_above:
        detail += f" (shown above max_failed_rate {bound:.1%}): the run is not trusted"
    elif status != "pass":
        detail += f" (above max_failed_rate {bound:.1%}, not shown above it: more requests decide)"
    if counts.retries:
        detail += f"; {counts.retries} retries"
    return Criterion(f"failed_rate_{arm}", None, status, "at_most", None, bound, k / n, ci.low, ci.high,
                     ci.level, None, None, None, n, None, detail, "primary", "requests", level,
                     infrastructure=shown_above)


def speedup(base: np.ndarray, cand: np.ndarray, policy: GatePolicy, level: float, m: int) -> Criterion:
    """Ratio of mean per-request throughput cand/base (independent samples, delta method on log)."""
    b, c = np.asarray(base, float), np.asarray(cand, float)
    if b.size < 2 or c.size < 2 or b.mean() <= 0 or c.mean() <= 0:
        return not_evaluated("speedup", "at_least", policy.min_speedup, None, "too few throughput samples")
    theta = math.log(c.mean() / b.mean())
    se = math.sqrt(c.var(ddof=1) / (c.size * c.mean() ** 2) + b.var(ddof=1) / (b.size * b.mean() ** 2))
    detail = f"{b.mean():.1f} → {c.mean():.1f} tok/s per request"
    q = st.norm_isf(level)
    if policy.min_speedup is None:
        return Criterion("speedup", None, "not_evaluated", "at_least", None, None, math.exp(theta),
                         math.exp(theta - q * se), math.exp(theta + q * se), 1 - 2 * level,
                         n=b.size + c.size, detail=detail + "; min_speedup not set: reported only")
    crit = one_sided("speedup", None, "at_least", math.log(policy.min_speedup), theta, se, math.inf,
                     b.size + c.size, level, detail, m, "primary", "requests")
    return dataclasses.replace(crit, estimate=math.exp(theta), ci_low=math.exp(crit.ci_low),
                               ci_high=math.exp(crit.ci_high), bound_low=policy.min_speedup)


def steady_speedup(s: SteadySpeed, policy: GatePolicy, level: float, m: int) -> Criterion:
    """The throughput ratio cand/base at saturation, from a `kvqual load` session (`--speed-from`),
    judged with the load's own statistics (`stats.fieller_ratio_ci`, as load/ uses): Fieller's interval on the two arms' batch
    means at 1 − 2·level, and the test it inverts, T = (ȳ − r0·x̄) / √(v_y + r0²·v_x) on the same
    Welch–Satterthwaite df, of H0: ratio ≤ min_speedup. Each arm's batches are its units. The evidence
    is the same at every look (not per item), so more items never decide it: no n_more."""
    b, c, bound = s.base, s.cand, policy.min_speedup
    n = int(b.size + c.size)
    detail = f"steady-state output tok/s {b.mean():.1f} → {c.mean():.1f} at saturation; {s.source}"
    status: Status = "not_evaluated" if bound is None else "inconclusive"
    if b.size < 2 or c.size < 2 or not b.mean() > 0:
        est = float(c.mean() / b.mean()) if b.size and c.size and b.mean() > 0 else None
        return Criterion("speedup", None, status, "at_least", bound, None, est, n=n, role="primary", unit="batches",
                         detail=detail + "; an arm has fewer than 2 batches: no interval (run kvqual load longer)",
                         level=None if bound is None else level)
    ci = st.fieller_ratio_ci(b, c, 1 - 2 * level)
    detail += (f"; Fieller on {b.size} + {c.size} batch means, {ci.df:.1f} df" if ci.df is not None else
               "; neither arm's batches vary") + "; the same evidence at every look"
    if bound is None:
        return Criterion("speedup", None, "not_evaluated", "at_least", None, None, ci.estimate, ci.low, ci.high,
                         ci.level, n=n, detail=detail + "; min_speedup not set: reported only", unit="batches")
    if ci.low is None:  # the baseline's throughput is not shown above zero: Fieller's set is unbounded
        return Criterion("speedup", None, "inconclusive", "at_least", bound, None, ci.estimate, None, None, ci.level,
                         n=n, detail=detail + "; the baseline's throughput is not shown above zero: no interval",
                         unit="batches", level=level)
    t, df = st.fieller_t(b, c, bound)
    df = math.inf if df is None else df  # no variance: T is ±inf (or 0 on the bound), decided either way
    return Criterion("speedup", None, "inconclusive", "at_least", bound, None, ci.estimate, ci.low, ci.high, ci.level,
                     _cdf(-t, df), _cdf(t, df), None, n, None, detail, "primary", "batches", level)
