""""On its margin": a non-binding futility stop, and what a *new* compare would need.

At an undecided look k of a plan whose last look judges N items, each open criterion's predictive
power is the chance that the plan's last look decides it: PASS (its interval clears the bound on
the inside) or FAIL (on the outside), averaged over what the data so far say of the truth (a flat
prior: θ ~ N(θ̂ₖ, SEₖ²)). The final estimate is then normal with mean θ̂ₖ and variance
SEₖ²·(N − nₖ)/N, and the final interval's half-width is z·SEₖ·√(nₖ/N) (Pocock: the same nominal level
at every look). The verdict can PASS only if every open primary criterion passes, and FAIL if any
criterion fails, so
    P(decided) ≤ min over open primary criteria of P(pass) + Σ over open criteria of P(fail),
and the compare stops as "on its margin" when that is below FUTILITY_POWER.

Why predictive and not "conditional power at the current estimate" (the truth taken to be θ̂ₖ, final
variance SEₖ²·nₖ(N − nₖ)/N²): measured by simulation on the default plan (124 → 2,108 items, 5 looks,
per-item sd 0.3, margin 5 points, 2,000 compares each; tests/test_futility.py), the current-trend rule
cost 3.8% of the compares of a candidate *equal* to the baseline their PASS (76 of 2,000) and 22.6% of
those half a margin down (452); the predictive rule cost none and 1.0% (19), and still ended 45% of
the compares whose truth sat on the bound before their last look (1,501 items on average, not 2,108).

Why this cannot raise the false-PASS rate: the stop only ever turns a look that would have gone on
into INCONCLUSIVE; it never makes a PASS. Dropping it (running on) keeps the plan's α, so the rule
is non-binding (tests/test_futility.py checks both by simulation with the truth on the bound).
Using the last look only (not "any remaining look") understates the chance of deciding a little,
so the stop errs toward stopping: a cost in power (measured above), never in error rate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from scipy.stats import norm

from kvqual.gate.criterion import Criterion

FUTILITY_POWER = 0.10  # stop when the plan decides with less than this chance at the current estimate
PLAN_POWERS = (0.80, 0.90)  # the planning statement: a new compare's total items at these powers
ABSURD = 100  # a plan past this multiple of the items judged (or a million items) is not stated
_LOG_SCALE = ("length_ratio", "speedup")  # intervals of a ratio: judged on the log scale


@dataclass(frozen=True)
class Side:
    """A criterion on a linear scale: estimate, one-sided standard errors toward each end, bounds."""

    est: float
    se_low: float
    se_high: float
    low: float | None  # the bound below which it fails (at_least / within)
    high: float | None  # the bound above which it fails (at_most / within)


def side_of(c: Criterion) -> Side | None:
    """The criterion's estimate and standard errors read back from its interval (z at its level);
    None when it has no interval or level."""
    if None in (c.estimate, c.ci_low, c.ci_high, c.level) or not 0 < (c.level or 0) < 0.5:
        return None
    est, lo, hi = float(c.estimate), float(c.ci_low), float(c.ci_high)  # type: ignore[arg-type]
    b_lo, b_hi = c.bound_low, c.bound_high
    if c.name in _LOG_SCALE:
        if min(est, lo, hi) <= 0:
            return None
        est, lo, hi = math.log(est), math.log(lo), math.log(hi)
        b_lo = math.log(b_lo) if b_lo is not None and b_lo > 0 else None
        b_hi = math.log(b_hi) if b_hi is not None and b_hi > 0 else None
    z = float(norm.isf(c.level))
    if not all(math.isfinite(x) for x in (est, lo, hi)):
        return None
    return Side(est, max(est - lo, 0.0) / z, max(hi - est, 0.0) / z, b_lo, b_hi)


# criteria whose PASS side is a betting bound (gate/tokens.py, gate/tail.py): with nothing or little above
# zero its width shrinks as 1/n, not 1/√n, so the normal projection below would call a PASS that more items
# bring (an unchanged config on a 500-item pool) futile
BETTING = ("kl_excess", "top1_loss", "broken_share")


def conditional_power(c: Criterion, n_now: int, n_final: int, predictive: bool = True,
                      running_alpha: float | None = None) -> tuple[float, float] | None:
    """(P(pass), P(fail)) at the plan's last look; None when the criterion has no interval to read. At
    the last look itself (n_final ≤ n_now): nothing more to learn, (0, 0). `predictive` (the default):
    averaged over the truth's uncertainty now; False: the truth taken to be the estimate now.
    `running_alpha`: the token criteria's PASS side is one betting process tested at this α; for those
    whose estimate is inside the bound, P(pass) is 1 when the betting arithmetic reaches the bound by the
    last look at the rate seen (`tail.units_to_bound`, exact for the share of broken prompts; for the
    token means, whose bound shrinks at least as fast as a t bound, the normal projection at α), else 0."""
    s = side_of(c)
    if s is None:
        return None
    if n_final <= n_now:
        return 0.0, 0.0
    if running_alpha is not None and c.name in BETTING and s.high is not None and s.est < s.high:
        return _betting_power(c, s, n_now, n_final, running_alpha, predictive)
    z = float(norm.isf(c.level))  # type: ignore[arg-type]
    shrink = math.sqrt(n_now / n_final)
    spread = math.sqrt((n_final - n_now) / n_final) if predictive else math.sqrt(n_now * (n_final - n_now)) / n_final

    def prob_below(x: float, se: float) -> float:  # P(final estimate < x)
        sd = se * spread
        return float(norm.cdf((x - s.est) / sd)) if sd > 0 else float(s.est < x)

    p_pass, p_fail = 1.0, 0.0
    if s.high is not None:  # inside is below: pass when est + z·se_high·shrink < high
        p_pass *= prob_below(s.high - z * s.se_high * shrink, s.se_high)
        p_fail += 1.0 - prob_below(s.high + z * s.se_low * shrink, s.se_low)
    if s.low is not None:  # inside is above
        p_pass = max(0.0, p_pass - prob_below(s.low + z * s.se_low * shrink, s.se_low)) if s.high is not None \
            else 1.0 - prob_below(s.low + z * s.se_low * shrink, s.se_low)
        p_fail += prob_below(s.low - z * s.se_high * shrink, s.se_high)
    return p_pass, min(1.0, p_fail)


def _betting_power(c: Criterion, s: Any, n_now: int, n_final: int, alpha: float,
                   predictive: bool) -> tuple[float, float]:
    """`conditional_power` for a betting PASS side with the estimate inside its bound (its docstring)."""
    from kvqual.gate.tail import units_to_bound

    fail = conditional_power(dataclasses.replace(c, name="_"), n_now, n_final, predictive)
    p_fail = fail[1] if fail is not None else 0.0
    units_final = c.n * n_final / n_now  # independent units scale with the items
    if c.name == "broken_share":
        if s.est > 0:  # broken prompts are turning up: a normal projection of a rare count's FAIL chance is far
            return 0.0, 1.0  # too low (3% broken showed 1 of 124 at look 1), so never futile while they do
        # the units a path growing at the rate seen takes from its start (the seen ones' growth included)
        more = units_to_bound(s.high, alpha, max(0, round(s.est * c.n)), c.n)
        need = None if more is None else more - c.n
        return (1.0 if need is not None and need <= units_final else 0.0), p_fail
    z = float(norm.isf(alpha))
    return (1.0 if s.est + z * s.se_high * math.sqrt(n_now / n_final) < s.high else 0.0), p_fail


def decided_power(criteria: Sequence[Criterion], n_now: int, n_final: int, predictive: bool = True,
                  running_alpha: float | None = None) -> float | None:
    """Upper bound on the chance the plan's last look decides the verdict (the module docstring);
    None when some open criterion cannot be read (then no futility stop)."""
    open_primary = [c for c in criteria if c.role == "primary" and c.status == "inconclusive"]
    open_any = [c for c in criteria if c.status == "inconclusive" and c.p_fail is not None]
    if not open_primary or any(c.infrastructure for c in open_primary):
        return None
    powers = {id(c): conditional_power(c, n_now, n_final, predictive, running_alpha)
              for c in {id(c): c for c in open_primary + open_any}.values()}
    if any(powers[id(c)] is None for c in open_primary):
        return None
    p_pass = min(powers[id(c)][0] for c in open_primary)  # type: ignore[index]
    p_fail = sum(p[1] for c in open_any if (p := powers[id(c)]) is not None)
    return min(1.0, p_pass + p_fail)


def items_for_power(c: Criterion, n_now: int, alpha: float, power: float) -> int | None:
    """Total items a new fixed-n compare needs to decide `c` with `power` at level `alpha` if the
    truth is the estimate now: n = nₖ·((z₁₋α + z_power)·SEₖ / gap)², gap the distance to the
    nearest bound; None when absurd (the estimate on the bound, or past ABSURD × nₖ or 10⁶ items)."""
    s = side_of(c)
    if s is None or n_now < 1:
        return None
    if c.name == "broken_share" and s.high is not None and s.est < s.high and c.n:
        # a betting bound on a share near zero: the units it takes at the rate seen (tail.units_to_bound), in items
        from kvqual.gate.tail import units_to_bound

        more = units_to_bound(s.high, alpha, max(0, round(s.est * c.n)), c.n)
        return None if more is None else math.ceil((more - c.n) * n_now / c.n)
    if c.name in BETTING and s.high is not None and s.est < s.high and c.ci_high is not None and c.ci_high > s.high:
        # a betting bound with little spread narrows as 1/n (at most as 1/√n: the projection below): the
        # items at which its width now, so narrowed, fits the gap
        n = math.ceil(n_now * (c.ci_high - s.est) / (s.high - s.est))
        return None if n > min(ABSURD * n_now, 1_000_000) else n
    gaps = [(b - s.est, s.se_high if s.est < b else s.se_low) for b in (s.low, s.high) if b is not None]
    if not gaps:
        return None
    gap, se = min(gaps, key=lambda g: abs(g[0]))
    if gap == 0 or se <= 0:
        return None
    n = math.ceil(n_now * ((float(norm.isf(alpha)) + float(norm.ppf(power))) * se / abs(gap)) ** 2)
    return None if n > min(ABSURD * n_now, 1_000_000) else n


# ------------------------------------------------------------ the facts and words the verdict carries


def margin_facts(criteria: Sequence[Criterion], policy: Any, look: int, n_items: int,
                 n_final: int) -> dict[str, Any] | None:
    """The futility stop (gate/futility.py): None unless the plan's last look would decide with less
    than FUTILITY_POWER at the current estimates; else the facts report.json carries as `on_margin`:
    the look, the chance of deciding, and each open primary criterion with its interval, its bound's
    origin and precision, and the total items a new compare would need for 80% / 90% power."""
    power = decided_power(criteria, n_items, n_final,
                          running_alpha=policy.alpha if getattr(policy, "betting", None) == "running" else None)
    if power is None or power >= FUTILITY_POWER:
        return None
    if n_final <= n_items and not any(  # the plan ended: on its margin only if no feasible size decides it
            items_for_power(c, n_items, policy.alpha, PLAN_POWERS[0]) is None
            for c in criteria if c.role == "primary" and c.status == "inconclusive" and c.estimate is not None):
        return None
    from kvqual.gate.origin import BOUND_FIELD, bound_origin

    rows = []
    for c in criteria:
        if c.role != "primary" or c.status != "inconclusive":
            continue
        origin = bound_origin(policy, BOUND_FIELD[c.name]) if c.name in BOUND_FIELD else None
        rows.append({"label": c.label, "name": c.name, "estimate": c.estimate, "ci_low": c.ci_low, "ci_high": c.ci_high,
                     "bound_low": c.bound_low, "bound_high": c.bound_high, "unit": c.unit,
                     "bound_origin": origin["text"] if origin else None,
                     "bound_range": origin.get("range") if origin else None,
                     "new_compare_items": {f"power_{round(p * 100)}": items_for_power(c, n_items, policy.alpha, p)
                                           for p in PLAN_POWERS}})
    by_name = {c.label: c for c in criteria}
    alpha = policy.alpha if getattr(policy, "betting", None) == "running" else None
    rows.sort(key=lambda r: (conditional_power(by_name[r["label"]], n_items, n_final, True, alpha) or (0.0, 0.0))[0])
    return {"look": look, "items": n_items, "final_items": n_final, "power": round(power, 4),
            "futility_power": FUTILITY_POWER, "criteria": rows}


_POINTS = ("accuracy", "accuracy_pooled", "top1_loss")


def _show(name: str, *xs: float | None) -> str:
    """Numbers in the criterion's unit: accuracy and top-1 in points, the rest as they are."""
    scale, unit = (100.0, " points") if name in _POINTS else (1.0, "")
    text = [("—" if x is None else f"{x * scale:+.2f}" if scale != 1.0 else f"{x:.4g}") for x in xs]
    return (text[0] if len(text) == 1 else f"{text[0]} [{', '.join(text[1:])}]") + unit


def on_margin_reason(facts: Mapping[str, Any]) -> str:
    """The verdict's first line when it stopped on its margin: each open criterion's interval, its
    bound and where the bound came from (its own precision), and what a new compare would need."""
    parts = []
    for r in facts["criteria"]:
        name, lo, hi = r["name"], r["bound_low"], r["bound_high"]
        bound = f"[{_show(name, lo)}, {_show(name, hi)}]" if lo is not None and hi is not None else \
            _show(name, lo if lo is not None else hi)
        plan = r["new_compare_items"]
        new = (f"a new compare needs ~{plan['power_80']:,} items for 80% power, ~{plan['power_90']:,} for 90%"
               if plan.get("power_80") and plan.get("power_90") else "no feasible new compare decides it at this estimate")
        est = r["estimate"]
        inside = est is not None and (lo is None or est > lo) and (hi is None or est < hi)
        # an estimate inside its bound that the plan's items cannot show inside (the share of broken prompts
        # on a pool short of the ~400 it takes) is not near its bound: say so, not "holds its bound"
        verb = "is inside its bound" if inside and name == "broken_share" else "holds its bound"
        parts.append(f"{r['label']} {_show(name, est, r['ci_low'], r['ci_high'])} {verb} {bound} "
                     f"({r['bound_origin'] or 'its bound'})"
                     + (", but this plan's items cannot show it" if verb == "is inside its bound" else "") + f"; {new}")
    return "on its margin: " + "; ".join(parts)


def new_compare(criteria: Sequence[Criterion], alpha: float, n_items: int) -> dict[str, Any]:
    """The planning statement once this plan cannot decide: for each open primary criterion, the total
    items a new fixed-n compare needs for 80% and 90% power at the current estimate (None: absurd)."""
    rows = {c.label: {f"power_{round(p * 100)}": items_for_power(c, n_items, alpha, p) for p in PLAN_POWERS}
            for c in criteria if c.role == "primary" and c.status == "inconclusive" and c.estimate is not None}
    return {"items": n_items, "alpha": alpha, "criteria": rows}


def planning_words(planning: Mapping[str, Any]) -> str:
    """'; a new compare needs ~N items …': the largest total over the open criteria (all must decide)."""
    rows = planning["criteria"]
    if not rows:
        return ""
    absurd = [label for label, r in rows.items() if not (r.get("power_80") and r.get("power_90"))]
    if absurd:
        return f"; no feasible new compare decides {', '.join(absurd)} at this estimate"
    n80, n90 = max(r["power_80"] for r in rows.values()), max(r["power_90"] for r in rows.values())
    return f"; a new compare (another --seed) needs ~{n80:,} items for 80% power, ~{n90:,} for 90%, at these estimates"
