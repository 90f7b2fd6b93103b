"""The tail: the share of prompts a candidate broke (docs/statistics.md, "Broken prompts").

A mean over prompts can hide a few prompts broken badly, the fp8 failure seen in the field (a scale
overflowing on outlier tokens, one long context, NaN logits), so a PASS also bounds how many there
are. Declared before any data (`[gate]`): an independent unit (an item, or a shared context) is
**broken by the candidate** when one of its prompts scores a mean teacher-forced KL(base‖cand)
above `broken_kl` nats/token, or when the candidate answered it with something that is not data
(NaN/inf logprobs, a body that is not JSON) where the baseline answered; it is **broken in the A/A
floor** when the baseline's second pass scores it so. `broken_share` is the candidate's share of
broken units minus the floor's, at most `max_broken_share` (π):
- PASS side: a betting bound (`stats.UpperBet`, cap 1) on the share of units the candidate broke
  and the floor did not (the excess is at most that share), in the plan's seeded order: exact at
  any n, whatever the tail. With no unit broken it reaches π from about log(1/α)/(0.75·π) units
  (`units_to_bound`): ~400 at π = 1%;
- FAIL side: an exact one-sided binomial test of the units the candidate broke and the floor did not,
  against π plus the floor's own share beyond the candidate's (nearly always 0).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from kvqual import stats as st
from kvqual.gate.criterion import Criterion, Status, _unit, not_evaluated
from kvqual.gate.inputs import BrokenUnits, TokenPairs, UnusableAnswers, cluster_firsts, first_rank, seeded
from kvqual.gate.policy import GatePolicy


def _any_by_cluster(flags: np.ndarray, codes: np.ndarray, g: int) -> np.ndarray:
    """A cluster is broken when any of its units is (its units are one independent unit)."""
    return np.bincount(codes, weights=flags.astype(float), minlength=g) > 0


def units_to_bound(share: float, alpha: float, broken: int = 0, seen: int = 0, log_capital: float = 0.0) -> int | None:
    """Independent units, in all, at which the PASS side's betting bound reaches `share` if every unit
    from here on is broken at the rate seen so far (`broken` of `seen`; 0 of 0: none broken): the
    expected growth of the log capital per unit, at the largest bet (0.75/(1 − π)), until it
    reaches log(1/α) from `log_capital`. None when that rate does not let it grow (a share seen at
    or above π's reach)."""
    lam = st.BET_TRUNCATION / (1 - share)
    rate = broken / seen if seen else 0.0
    growth = (1 - rate) * math.log1p(lam * share) + rate * math.log1p(-lam * (1 - share))
    if growth <= 0:
        return None
    return seen + max(0, math.ceil((math.log(1 / alpha) - log_capital) / growth))


def broken_units(tp: TokenPairs | None, unusable: UnusableAnswers | None, broken_kl: float) -> BrokenUnits | None:
    """The units the tail criterion judges: every token pair (broken where its KL is above
    `broken_kl`, in the candidate or in the floor) and every unusable answer (broken by the
    candidate). None when there are neither, or no KL was measured."""
    has_kl = tp is not None and tp.kl_cand is not None and tp.kl_floor is not None
    n_bad = 0 if unusable is None else unusable.clusters.size
    if not has_kl and not n_bad:
        return None
    n_tp = tp.kl_cand.size if has_kl else 0  # type: ignore[union-attr]
    parts_c = [tp.kl_cand > broken_kl] if has_kl else []  # type: ignore[union-attr, operator]
    parts_f = [tp.kl_floor > broken_kl] if has_kl else []  # type: ignore[union-attr, operator]
    clusters = _join([tp.clusters if has_kl else None, unusable.clusters if n_bad else None],  # type: ignore
                     [n_tp, n_bad], "u")
    ranks = [tp.rank if has_kl else None, unusable.rank if n_bad else None]  # type: ignore[union-attr]
    rank = None if any(r is None for r, k in zip(ranks, [n_tp, n_bad]) if k) else \
        np.concatenate([r for r, k in zip(ranks, [n_tp, n_bad]) if k])
    return BrokenUnits(np.concatenate(parts_c + [np.ones(n_bad, bool)]),
                       np.concatenate(parts_f + [np.zeros(n_bad, bool)]), clusters, rank,
                       np.concatenate([np.zeros(n_tp, bool), np.ones(n_bad, bool)]))


def _join(parts: list[np.ndarray | None], sizes: list[int], tag: str) -> np.ndarray | None:
    """Cluster ids of several groups of units, one array (None: every unit its own cluster, as given)."""
    if all(p is None for p, n in zip(parts, sizes) if n):
        return None if sum(1 for n in sizes if n) <= 1 else np.array(
            [f"{tag}{i}:{j}" for i, n in enumerate(sizes) for j in range(n)], dtype=object)
    return np.concatenate([p if p is not None else np.array([f"{tag}{i}:{j}" for j in range(n)], dtype=object)
                           for i, (p, n) in enumerate(zip(parts, sizes)) if n])


def broken_share(bu: BrokenUnits | None, policy: GatePolicy, level: float, m: int) -> Criterion:
    """The candidate's share of broken units beyond the A/A floor's, at most π (module docstring).
    With `policy.betting == "running"` the PASS side is one process over the looks at α (the status
    is set here); else a process per look at `level`. Every unit the candidate answered with
    something that is not data counts as broken, and the detail says how many."""
    bound = policy.max_broken_share
    if bu is None or bu.cand.size == 0:
        return not_evaluated("broken_share", "at_most", None, bound, "no teacher-forced units to judge")
    order = seeded(bu.rank, bu.cand.size)
    clusters = None if bu.clusters is None else bu.clusters[order]
    codes, g = cluster_firsts(clusters, bu.cand.size)
    cand, floor = _any_by_cluster(bu.cand[order], codes, g), _any_by_cluster(bu.floor[order], codes, g)
    _, unit = _unit(clusters, bu.cand.size)
    if g < 2:
        return Criterion("broken_share", None, "inconclusive", "at_most", None, bound, n=g, unit=unit,
                         detail="fewer than 2 independent units")
    counts = st.paired_counts(floor, cand)  # "base" = the floor, "cand" = the candidate: c − b is the excess
    est = counts.difference
    running = policy.betting == "running"
    alpha = policy.alpha if running else level
    only_cand = (cand & ~floor).astype(float)
    bet_on = only_cand
    if running and clusters is not None:  # a cluster's flag fixed when it first appears: its first item's units
        ranks = np.arange(bu.cand.size) if bu.rank is None else bu.rank[order]
        first = ranks == first_rank(codes, ranks)
        bet_on = (_any_by_cluster(bu.cand[order] & first, codes, g)
                  & ~_any_by_cluster(bu.floor[order] & first, codes, g)).astype(float)
    bet = st.UpperBet(bet_on, 1.0, None, alpha, running=running)
    high, p_pass = bet.upper(), bet.p_value(bound)
    # FAIL side exact: the units the candidate broke and the floor did not (c), against π plus the floor's
    # own share beyond the candidate's (b/g, nearly always 0): a one-sided binomial test. A score test is far
    # too eager on rare counts (4 of 102 read p = 0.0016 against the binomial's 0.019 at π = 1%)
    floor_only = counts.b / counts.n
    p_fail = float(stats.binomtest(counts.c, counts.n, min(1.0, bound + floor_only), alternative="greater").pvalue)
    low = max(-1.0, st.clopper_pearson_ci(counts.c, counts.n, 1 - 2 * level).low - floor_only)
    unusable = 0 if bu.unusable is None else int(bu.unusable.sum())
    detail = (f"{int(cand.sum())} of {g} {unit} broken by the candidate, {int(floor.sum())} in the A/A floor "
              f"(mean KL above {policy.broken_kl:g} nats/token"
              + (f", or an answer that is not data: {unusable}" if unusable else "") + ")"
              + f"; the sample bounds the share the candidate broke at {high:.2%}")
    status: Status = "pass" if running and p_pass < alpha else "inconclusive"
    n_more = None
    if est < bound:
        total = units_to_bound(bound, alpha, int(bet_on.sum()), g, bet.log_capital(bound))
        n_more = None if total is None else max(1, total - g)
    return Criterion("broken_share", None, status, "at_most", None, bound, est, low, high, 1 - 2 * level, p_pass,
                     p_fail, None, g, n_more, detail, "primary", unit, level)
