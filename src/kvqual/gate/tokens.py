"""The token-level criteria (mean KL and top-1 disagreement over their A/A floor): a betting bound on
the PASS side, Hall-corrected t on the FAIL side, the cluster bootstrap where asked for.
gate/criteria.py re-exports these names; docs/statistics.md, "Token criteria"."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from kvqual import stats as st
from kvqual.gate.criterion import Criterion, Status, _cdf, _n_more, _quantile, _standardized, _unit, not_evaluated
from kvqual.gate.inputs import (TokenCoverage, TokenPairs, UnusableAnswers, cluster_firsts, first_rank, n_clusters,
                               seeded)
from kvqual.gate.policy import GatePolicy
from kvqual.gate.tail import broken_share, broken_units


def _bet_n_more(est: float, upper: float, g: int, bound: float, cap: float, level: float) -> int | None:
    """Clusters until a betting bound now at `upper` (mean `est`) would reach `bound`, if the values
    hold: its width behaves as a/√G + b/G, b = cap·log(1/level)/c the part a sample with no spread
    keeps (`stats.UpperBet`), a fitted from the width now. None when the estimate is not inside."""
    gap = bound - est
    if gap <= 0 or not math.isfinite(upper):
        return None
    b = cap * math.log(1 / level) / st.BET_TRUNCATION
    a = max(0.0, (upper - est) - b / g) * math.sqrt(g)
    x = (-a + math.sqrt(a * a + 4 * b * gap)) / (2 * b)  # 1/√G at which a·x + b·x² = gap
    return max(1, math.ceil(1 / (x * x)) - g)


def token_excess(name: str, bound: float, cand: np.ndarray, floor: np.ndarray, clusters: np.ndarray | None,
                 level: float, detail: str, m: int, cap: float, rank: np.ndarray | None = None,
                 alpha: float | None = None) -> Criterion:
    """An at-most criterion on the mean excess of nonnegative per-unit values (mean KL, top-1
    disagreement) over their A/A floor, each independent unit (an item, or a shared context: the
    mean of its units) weighing the same, each counted at most `cap`. Such values are right-skewed
    and, on a GPU A/A, almost all exactly 0: a t bound is short on its PASS side, and a bound built
    from the sample's own spread is undefined or infinite when nearly nothing varies. So each side
    has its own statistic (docs/statistics.md, "Token criteria"):
    - PASS side (the upper bound): a betting confidence bound (`stats.UpperBet`), valid at any n and
      any skew, on the values capped at `cap`, a cap fixed before the data: no finite-sample bound
      exists for a mean of values unbounded above, so the quantity bounded, and printed, is the
      **capped mean**; the units above the cap are broken prompts, which the tail criterion
      (gate/tail.py) bounds in number. The units are bet on in the plan's seeded order (`rank`),
      never in the order of their ids: betting needs an order fixed before the data.
      `alpha` given: one running process over the looks, tested at α itself (the status is set
      here); None: a process per look at `level`;
    - FAIL side (the lower bound): the t statistic through Hall's skewness correction on the capped
      values; on right-skewed values it errs on the conservative side, and a capped mean shown above
      the bound puts the mean above it too."""
    order = seeded(rank, cand.size)
    cand, floor = cand[order], floor[order]
    clusters = None if clusters is None else clusters[order]
    g, unit = _unit(clusters, cand.size)
    units = cand.size
    running = alpha is not None
    bet_on = None  # the PASS side's values, where they differ from `values`
    if clusters is not None:  # one value per independent unit: the mean of its units, in first-appearance order
        codes, _ = cluster_firsts(clusters, cand.size)
        size = np.bincount(codes)
        if running:
            # one path over the looks needs each cluster's value fixed when it first appears: the mean of its
            # units of its first item (its first rank), a random member's, so still unbiased for its mean;
            # the cluster's later items, which a later look adds, then never change a bet already made
            ranks = np.arange(cand.size) if rank is None else np.asarray(rank)[order]
            first = ranks == first_rank(codes, ranks)
            fsize = np.bincount(codes, weights=first)
            bet_on = np.minimum(np.bincount(codes, weights=(cand - floor) * first) / fsize, cap)
        cand, floor = np.bincount(codes, weights=cand) / size, np.bincount(codes, weights=floor) / size
    raw = cand - floor
    values = np.minimum(raw, cap)
    est = float(values.mean())
    if np.all(values == values[0]):
        se, df, skew = 0.0, float(g - 1), 0.0
    else:
        mc = st.mean_ci(values)
        se, df, skew = mc.se, float(mc.df), st.cluster_skewness(values)
    gz = st.hall_transform(_standardized(est - bound, se), skew, g)
    p_fail = 1.0 - _cdf(gz, df)
    low = est - se * st.hall_inverse(_quantile(level, df), skew, g)
    bet = st.UpperBet(values if bet_on is None else bet_on, cap, None, alpha if running else level, running=running)
    high, p_pass = bet.upper(), bet.p_value(bound)
    above = int(np.sum(raw > cap))
    detail += (f"; each unit counted at most {cap:.3g} (the mean of the values as they are: {float(raw.mean()):.4g}"
               + (f", {above} units above the cap" if above else "") + ")"
               + ("; upper bound by one betting process over the looks at α" if running else
                  "; upper bound by betting at this look's level")
               + (f", lower by Hall-corrected t (skewness {skew:.2f})" if skew else ""))
    if g < units:
        detail += f"; {g} independent {unit}, each the mean of its units" + (
            " (bet on as the mean of its first item's, fixed when it first appears)" if bet_on is not None else "")
    n_more = _bet_n_more(est, high, g, bound, cap, alpha if running else level) if est < bound else \
        _n_more(est, se * math.sqrt(g), g, bound, False, level, m)
    status: Status = "pass" if running and p_pass < alpha else "inconclusive"
    return Criterion(name, None, status, "at_most", None, bound, est, low, high, 1 - 2 * level, p_pass, p_fail,
                     None, g, n_more, detail, "primary", unit, level)


def _bootstrap_at_most(name: str, values: np.ndarray, clusters: np.ndarray | None, bound: float,
                       resamples: int, level: float, rng: np.random.Generator, detail: str, m: int) -> Criterion:
    """Percentile cluster bootstrap; p-values invert the percentile interval at the bound."""
    g = np.unique(clusters.astype(str), return_inverse=True)[1] if clusters is not None else np.arange(values.size)
    sums, sizes = np.bincount(g, weights=values), np.bincount(g).astype(float)
    idx = rng.integers(0, sums.size, size=(resamples, sums.size))
    boot = sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)
    b = boot.size
    est = float(values.mean())
    p_pass = (1 + int(np.sum(boot >= bound))) / (b + 1)
    p_fail = (1 + int(np.sum(boot <= bound))) / (b + 1)
    low, high = np.quantile(boot, [level, 1 - level])
    n = sums.size
    sd = float(boot.std(ddof=1)) * math.sqrt(n)
    return Criterion(name, None, "inconclusive", "at_most", None, bound, est, float(low), float(high),
                     1 - 2 * level, p_pass, p_fail, None, n, _n_more(est, sd, n, bound, est < bound, level, m),
                     detail, "primary", "items", level)


TOKEN_CRITERIA = ("kl_excess", "top1_loss")


def token_criteria(tp: TokenPairs | None, coverage: TokenCoverage | None, policy: GatePolicy, level: float, m: int,
                   rng: np.random.Generator, unusable: UnusableAnswers | None = None) -> list[Criterion]:
    """kl_excess and top1_loss, each on the mean per-unit excess over the A/A floor, and broken_share,
    the share of prompts the candidate broke (gate/tail.py), all three from teacher forcing.

    A missing criterion is never a pass: with teacher forcing requested and fewer than
    `min_token_coverage` of the pairs usable, all three are INCONCLUSIVE with the reasons; only a
    user who turned teacher forcing off gets them as not evaluated."""
    bounds = {"kl_excess": policy.max_kl_excess, "top1_loss": policy.max_top1_loss,
              "broken_share": policy.max_broken_share}
    if coverage is not None and not coverage.requested:
        return [not_evaluated(n, "at_most", None, b, "teacher forcing turned off (--no-teacher-forcing)")
                for n, b in bounds.items()]
    short, infrastructure = None, False
    if coverage is not None and coverage.pairs and coverage.share < policy.min_token_coverage:
        why = ", ".join(f"{r}: {k}" for r, k in coverage.reasons.most_common()) or "no reason recorded"
        # the share rounded down to 0.1%: 79.9% < 80%, never the "80% < 80%" rounding gave
        share = f"{math.floor(coverage.share * 1000) / 10:g}%"
        short = (f"token metrics usable on {coverage.usable} of {coverage.pairs} pairs "
                 f"({share} < min_token_coverage {policy.min_token_coverage:.0%}); {why}")
        # short only because requests failed after their retries (teacher forcing, or an answer that left no
        # pair to force): an infrastructure fault, which more items would not mend; retrying those requests
        # (the same command again) does
        lost = coverage.failed + coverage.unanswered
        if lost and (coverage.usable + lost) / (coverage.pairs + coverage.unanswered) >= policy.min_token_coverage:
            infrastructure = True
            what = " and ".join(f"{n} {kind} request{'s' * (n != 1)}" for n, kind in (
                (coverage.unanswered, "answer"), (coverage.failed, "teacher-forcing")) if n)
            short = (f"infrastructure: {what} failed after their retries, leaving token metrics on "
                     f"{coverage.usable} of {coverage.pairs} pairs ({share} < min_token_coverage "
                     f"{policy.min_token_coverage:.0%}); run the same command again to retry them")
    out: list[Criterion] = []
    for name, bound in bounds.items():
        if name == "broken_share":
            if tp is not None and tp.kl_cand is None:
                out.append(not_evaluated(name, "at_most", None, bound, tp.kl_missing or "KL not measured"))
                continue
            crit = broken_share(broken_units(tp, unusable, policy.broken_kl), policy, level, m)
            if crit.status == "not_evaluated":  # requested, so never a pass by absence
                crit = Criterion(name, None, "inconclusive", "at_most", None, bound, infrastructure=infrastructure,
                                 detail=short or "no unit with per-prompt KL to judge")
            elif short:
                crit = dataclasses.replace(crit, status="inconclusive", p_pass=None, p_fail=None,
                                           n_more=None if infrastructure else crit.n_more,
                                           detail=f"{short}; {crit.detail}", infrastructure=infrastructure)
            out.append(crit)
            continue
        if name == "kl_excess" and tp is not None and tp.kl_cand is None:
            out.append(not_evaluated(name, "at_most", None, bound, tp.kl_missing or "KL not measured"))
            continue
        if tp is None or tp.top1_cand.size < 2 or n_clusters(tp.clusters, tp.top1_cand.size) < 2:
            out.append(Criterion(name, None, "inconclusive", "at_most", None, bound, infrastructure=infrastructure,
                                 detail=short or "teacher forcing gave fewer than 2 usable pairs with an A/A floor"))
            continue
        values = tp.kl_cand - tp.kl_floor if name == "kl_excess" else tp.top1_floor - tp.top1_cand
        arm, flr = (tp.kl_cand, tp.kl_floor) if name == "kl_excess" else (tp.top1_cand, tp.top1_floor)
        label = "mean KL" if name == "kl_excess" else "same-top-1"
        detail = f"{label} cand {arm.mean():.4g} vs A/A floor {flr.mean():.4g} over {values.size} pairs"
        detail += f"; {tp.floor_note}" if tp.floor_note else ""
        if policy.bootstrap_resamples > 0:
            crit = _bootstrap_at_most(name, values, tp.clusters, bound, policy.bootstrap_resamples, level, rng,
                                      detail, m)
        else:
            cand, flr_share = (tp.kl_cand, tp.kl_floor) if name == "kl_excess" else (1 - tp.top1_cand, 1 - tp.top1_floor)
            cap = policy.token_cap * bound if name == "kl_excess" else 1.0  # top-1 disagreement is a share: at most 1
            crit = token_excess(name, bound, cand, flr_share, tp.clusters, level, detail, m, cap, tp.rank,
                                policy.alpha if policy.betting == "running" else None)
        if short:  # shown, but never decided on a fraction of the pairs
            crit = dataclasses.replace(crit, status="inconclusive", p_pass=None, p_fail=None,
                                       n_more=None if infrastructure else crit.n_more,
                                       detail=f"{short}; {crit.detail}", infrastructure=infrastructure)
        out.append(crit)
    return out
