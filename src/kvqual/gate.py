"""The gate: a policy, per-unit paired inputs → criteria → PASS / FAIL / INCONCLUSIVE.

Each criterion has a bound. Two one-sided tests per criterion: "shown inside" (p_pass)
and "shown outside" (p_fail). FAIL needs some criterion shown outside after Holm over
all criteria' p_fail, so when nothing changed the false-FAIL rate is ≤ alpha. PASS needs
every criterion shown inside at level alpha (an intersection–union test needs no
adjustment). Anything else is INCONCLUSIVE, with how many more items would decide it.
Intervals shown are (1 − 2·alpha) two-sided: each end is the one-sided bound the pass
test uses. Formulas and the defaults' reasons: docs/statistics.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

import numpy as np
from scipy import stats

from kvqual.compare import stats as st
from kvqual.errors import ConfigError

Status = Literal["pass", "fail", "inconclusive", "not_evaluated"]
Direction = Literal["at_least", "at_most", "within"]
VerdictName = Literal["PASS", "FAIL", "INCONCLUSIVE"]
EXIT_CODES: Mapping[str, int] = {"PASS": 0, "FAIL": 1, "INCONCLUSIVE": 3}


@dataclass(frozen=True)
class GatePolicy:
    """What "as good as the baseline" means; `[gate]` in kvqual.toml. Defaults: docs/statistics.md."""

    alpha: float = 0.05  # false-FAIL rate when nothing changed; also the false-PASS rate at a bound
    accuracy_margin: float = 0.05  # δ: cand may lose up to 5 points of accuracy (absolute)
    max_length_drift: float = 0.10  # mean output length within ±10% of the baseline's
    max_kl_excess: float = 0.03  # nats/token of KL(base‖cand) beyond the A/A floor
    max_top1_loss: float = 0.08  # same-top-1 agreement may drop 8 points below the A/A floor
    max_failed_rate: float = 0.01  # share of failed requests per arm
    min_speedup: float | None = None  # cand/base throughput ratio required; None: report only
    bootstrap_resamples: int = 0  # >0: cluster bootstrap for KL / top-1 instead of t intervals

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], path: str) -> "GatePolicy":
        """Validate the `[gate]` table; an unknown key, wrong type or bad range raises ConfigError."""
        if not isinstance(data, Mapping):
            raise ConfigError(path, "gate", f"expected a table, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                raise ConfigError(path, f"gate.{key}", f"unknown key (known: {', '.join(sorted(known))})")
            values[key] = _check(path, key, value)
        return cls(**values)


_RANGES: Mapping[str, tuple[float, float, str]] = {
    "alpha": (0.0, 0.5, "between 0 and 0.5 (exclusive)"),
    "accuracy_margin": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_length_drift": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_kl_excess": (0.0, math.inf, "positive"),
    "max_top1_loss": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "max_failed_rate": (0.0, 1.0, "between 0 and 1 (exclusive)"),
    "min_speedup": (0.0, math.inf, "positive"),
}


def _check(path: str, key: str, value: Any) -> Any:
    """Type- and range-check one `[gate]` value."""
    if key == "bootstrap_resamples":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"gate.{key}", f"expected an integer, got {type(value).__name__}")
        if value != 0 and value < 100:
            raise ConfigError(path, f"gate.{key}", "must be 0 (off) or at least 100")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"gate.{key}", f"expected a number, got {type(value).__name__}")
    low, high, words = _RANGES[key]
    if not low < value < high:
        raise ConfigError(path, f"gate.{key}", f"must be {words}, got {value}")
    return float(value)


# ---------------------------------------------------------------- inputs


def _array(value: Any, dtype: type, name: str) -> np.ndarray:
    a = np.asarray(value, dtype=dtype)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D")
    return a


def _same_length(obj: Any, names: tuple[str, ...]) -> None:
    lengths = {n: len(getattr(obj, n)) for n in names if getattr(obj, n) is not None}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{type(obj).__name__}: arrays differ in length: {lengths}")


@dataclass(frozen=True)
class AccuracyPairs:
    """One suite's scored items, paired by (item id, repeat): correct or not in each arm."""

    suite: str
    base_correct: np.ndarray
    cand_correct: np.ndarray
    clusters: np.ndarray | None = None  # context_id per item; None: items independent

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_correct", _array(self.base_correct, bool, "base_correct"))
        object.__setattr__(self, "cand_correct", _array(self.cand_correct, bool, "cand_correct"))
        _same_length(self, ("base_correct", "cand_correct", "clusters"))


@dataclass(frozen=True)
class LengthPairs:
    """Output lengths in tokens of one arm vs another, paired by item and repeat."""

    base: np.ndarray
    cand: np.ndarray
    clusters: np.ndarray | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", _array(self.base, float, "base"))
        object.__setattr__(self, "cand", _array(self.cand, float, "cand"))
        _same_length(self, ("base", "cand", "clusters"))


@dataclass(frozen=True)
class TokenPairs:
    """Per-item teacher-forced metrics: candidate vs baseline and the A/A floor, same items."""

    kl_cand: np.ndarray  # mean per-token KL(A‖B) of each item
    kl_floor: np.ndarray  # mean per-token KL(A‖A') of the same item
    top1_cand: np.ndarray  # share of the item's tokens where A and B agree on top-1
    top1_floor: np.ndarray  # same for A vs A'
    clusters: np.ndarray | None = None

    def __post_init__(self) -> None:
        for name in ("kl_cand", "kl_floor", "top1_cand", "top1_floor"):
            object.__setattr__(self, name, _array(getattr(self, name), float, name))
        _same_length(self, ("kl_cand", "kl_floor", "top1_cand", "top1_floor", "clusters"))


@dataclass(frozen=True)
class RequestCounts:
    """Failed and total requests of one arm."""

    failed: int
    total: int


@dataclass(frozen=True)
class GateInputs:
    """Everything the gate judges; a part left None is reported as not evaluated."""

    accuracy: tuple[AccuracyPairs, ...] = ()
    lengths: LengthPairs | None = None  # candidate (cand) vs baseline (base)
    lengths_floor: LengthPairs | None = None  # baseline replicate vs baseline: reported
    tokens: TokenPairs | None = None
    base_requests: RequestCounts | None = None
    cand_requests: RequestCounts | None = None
    base_throughput: np.ndarray | None = None  # per-request tokens/s
    cand_throughput: np.ndarray | None = None


# ---------------------------------------------------------------- outputs


@dataclass(frozen=True)
class Criterion:
    """One judged quantity: estimate, interval, bound, tests and status."""

    name: str
    suite: str | None
    status: Status
    direction: Direction
    bound_low: float | None
    bound_high: float | None
    estimate: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    ci_level: float | None = None
    p_pass: float | None = None  # one-sided: H0 outside the bound
    p_fail: float | None = None  # one-sided: H0 inside the bound
    p_fail_holm: float | None = None
    n: int = 0
    n_more: int | None = None
    detail: str = ""


@dataclass(frozen=True)
class Verdict:
    """The gate's answer, with every criterion behind it."""

    verdict: VerdictName
    criteria: tuple[Criterion, ...]
    reason: str
    policy: GatePolicy = field(default_factory=GatePolicy)

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def to_json(self) -> dict[str, Any]:
        """report.json form; non-finite numbers become null."""
        return _finite({
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "policy": dataclasses.asdict(self.policy),
            "criteria": [dataclasses.asdict(c) for c in self.criteria],
        })


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


# ---------------------------------------------------------------- criteria


def _cdf(x: float, df: float) -> float:
    """t (or normal when df is inf) CDF that accepts ±inf."""
    return float(stats.norm.cdf(x) if math.isinf(df) else stats.t.cdf(x, df))


def _standardized(diff: float, se: float) -> float:
    if se > 0:
        return diff / se
    return 0.0 if diff == 0 else math.copysign(math.inf, diff)


def _n_more(est: float, sd: float, n: int, bound: float, inside: bool, alpha: float, m: int) -> int | None:
    """Units to decide: pass side tested at alpha, fail side at Holm's worst alpha/m."""
    more = st.n_more_to_decide(est, sd, n, bound, alpha if inside else alpha / max(m, 1))
    return None if more is None else max(1, more)  # asked only of undecided criteria: at least one more


def _one_sided(name: str, suite: str | None, direction: Direction, bound: float, est: float,
               se: float, df: float, n: int, policy: GatePolicy, detail: str, m: int) -> Criterion:
    """A criterion judged by a t/normal test of est against one bound."""
    zed = _standardized(est - bound, se)
    if direction == "at_most":  # inside is below the bound
        p_pass, p_fail = _cdf(zed, df), 1.0 - _cdf(zed, df)
    else:
        p_pass, p_fail = 1.0 - _cdf(zed, df), _cdf(zed, df)
    q = float(stats.norm.ppf(1 - policy.alpha) if math.isinf(df) else stats.t.ppf(1 - policy.alpha, df))
    inside = (est > bound) if direction == "at_least" else (est < bound)
    return Criterion(
        name, suite, "inconclusive", direction,
        bound if direction == "at_least" else None, bound if direction == "at_most" else None,
        est, est - q * se, est + q * se, 1 - 2 * policy.alpha, p_pass, p_fail, None, n,
        _n_more(est, se * math.sqrt(n), n, bound, inside, policy.alpha, m), detail,
    )


def _bootstrap_at_most(name: str, values: np.ndarray, clusters: np.ndarray | None, bound: float,
                       policy: GatePolicy, rng: np.random.Generator, detail: str, m: int) -> Criterion:
    """Percentile cluster bootstrap; p-values invert the percentile interval at the bound."""
    g = np.unique(clusters, return_inverse=True)[1] if clusters is not None else np.arange(values.size)
    sums, sizes = np.bincount(g, weights=values), np.bincount(g).astype(float)
    idx = rng.integers(0, sums.size, size=(policy.bootstrap_resamples, sums.size))
    boot = sums[idx].sum(axis=1) / sizes[idx].sum(axis=1)
    b = boot.size
    est = float(values.mean())
    p_pass = (1 + int(np.sum(boot >= bound))) / (b + 1)
    p_fail = (1 + int(np.sum(boot <= bound))) / (b + 1)
    low, high = np.quantile(boot, [policy.alpha, 1 - policy.alpha])
    sd = float(boot.std(ddof=1)) * math.sqrt(values.size)
    return Criterion(name, None, "inconclusive", "at_most", None, bound, est, float(low), float(high),
                     1 - 2 * policy.alpha, p_pass, p_fail, None, values.size,
                     _n_more(est, sd, values.size, bound, est < bound, policy.alpha, m), detail)


def _accuracy(pairs: AccuracyPairs, policy: GatePolicy, m: int) -> Criterion:
    """Non-inferiority of cand − base accuracy at −δ: Tango score test, or cluster-robust t."""
    counts = st.paired_counts(pairs.base_correct, pairs.cand_correct)
    n, delta = counts.n, policy.accuracy_margin
    if n == 0:
        return Criterion("accuracy", pairs.suite, "not_evaluated", "at_least", -delta, None,
                         detail="no scored pairs")
    detail = (f"base {(counts.a + counts.b) / n:.1%} → cand {(counts.a + counts.c) / n:.1%}; "
              f"flips right→wrong {counts.b}, wrong→right {counts.c}; "
              f"McNemar exact p={st.mcnemar_exact_p(counts.b, counts.c):.3g}")
    diff = pairs.cand_correct.astype(float) - pairs.base_correct.astype(float)
    ci = st.tango_ci(counts, level=1 - 2 * policy.alpha)
    z = float(stats.norm.ppf(1 - policy.alpha))
    # the score interval's half-width as an SE: honest where the plain SE is not (no flips → 0)
    score_se = (ci.high - ci.low) / (2 * z)
    clustered = pairs.clusters is not None and np.unique(pairs.clusters).size < n
    if clustered:
        mc = st.mean_ci(diff, pairs.clusters)
        # Clustering adds uncertainty to what independent items would show; the cluster-robust SE
        # is 0 when nothing flips (it claimed "24 items, 0 flips: within 5 points for sure"), so it
        # is floored at the independent-items score SE.
        floored = score_se > mc.se
        crit = _one_sided("accuracy", pairs.suite, "at_least", -delta, mc.estimate, max(mc.se, score_se),
                          mc.df, n, policy, detail + f"; cluster-robust over {mc.n_clusters} contexts"
                          + (" (SE floored at the independent-items score SE)" if floored else ""), m)
        # a t interval on few clusters can pass ±1; a difference of proportions cannot
        return dataclasses.replace(crit, ci_low=max(-1.0, crit.ci_low), ci_high=min(1.0, crit.ci_high))
    zs = st.tango_z(counts, -delta)
    est = counts.difference
    sd = max(math.sqrt(max((counts.b + counts.c) / n - est**2, 0.0)), score_se * math.sqrt(n))
    return Criterion("accuracy", pairs.suite, "inconclusive", "at_least", -delta, None, est, ci.low,
                     ci.high, ci.level, float(stats.norm.sf(zs)), float(stats.norm.cdf(zs)), None, n,
                     _n_more(est, sd, n, -delta, est > -delta, policy.alpha, m), detail)


def _lengths(lp: LengthPairs, floor: LengthPairs | None, policy: GatePolicy, m: int) -> Criterion:
    """Ratio of mean lengths cand/base within 1 ± drift: two one-sided tests on the log scale."""
    lo, hi = 1 - policy.max_length_drift, 1 + policy.max_length_drift
    n = lp.base.size
    if n < 2 or lp.base.mean() <= 0 or lp.cand.mean() <= 0:
        return Criterion("length_ratio", None, "not_evaluated", "within", lo, hi, n=n,
                         detail="fewer than 2 pairs or an arm with no output")
    ci, se = st.ratio_of_means_ci(lp.base, lp.cand, lp.clusters, level=1 - 2 * policy.alpha)
    df = (np.unique(lp.clusters).size if lp.clusters is not None else n) - 1
    theta = math.log(ci.estimate)
    z_lo, z_hi = _standardized(theta - math.log(lo), se), _standardized(theta - math.log(hi), se)
    p_pass = max(1 - _cdf(z_lo, df), _cdf(z_hi, df))
    p_fail = min(1.0, 2 * min(_cdf(z_lo, df), 1 - _cdf(z_hi, df)))
    d = lp.cand - lp.base
    hl = st.hodges_lehmann(d, level=1 - 2 * policy.alpha)
    detail = (f"mean {lp.base.mean():.1f} → {lp.cand.mean():.1f} tokens; "
              f"HL shift {hl.estimate:+.1f} [{hl.low:+.1f}, {hl.high:+.1f}]; "
              f"Wilcoxon p={st.wilcoxon_signed_rank(lp.base, lp.cand).pvalue:.3g}; "
              f"KS p={st.ks_two_sample(lp.base, lp.cand).pvalue:.3g}")
    if floor is not None and floor.base.mean() > 0 and floor.cand.mean() > 0:
        detail += f"; A/A ratio {floor.cand.mean() / floor.base.mean():.3f} (n={floor.base.size})"
    nearest = lo if abs(theta - math.log(lo)) < abs(theta - math.log(hi)) else hi
    inside = lo < ci.estimate < hi
    n_more = _n_more(theta, se * math.sqrt(n), n, math.log(nearest), inside, policy.alpha, m)
    return Criterion("length_ratio", None, "inconclusive", "within", lo, hi, ci.estimate, ci.low,
                     ci.high, ci.level, p_pass, p_fail, None, n, n_more, detail)


def _failed(arm: str, counts: RequestCounts, policy: GatePolicy) -> Criterion:
    """Failed-request share: pass when observed ≤ max; candidate FAILs only when shown above."""
    k, n, bound = counts.failed, counts.total, policy.max_failed_rate
    if n <= 0:
        return Criterion(f"failed_rate_{arm}", None, "not_evaluated", "at_most", None, bound,
                         detail="no requests")
    ci = st.clopper_pearson_ci(k, n, level=1 - 2 * policy.alpha)
    p_fail = float(stats.binomtest(k, n, bound, alternative="greater").pvalue) if arm == "candidate" else None
    status: Status = "pass" if k / n <= bound else "inconclusive"
    return Criterion(f"failed_rate_{arm}", None, status, "at_most", None, bound, k / n, ci.low, ci.high,
                     ci.level, None, p_fail, None, n, None,
                     f"{k} of {n} requests failed" + ("" if status == "pass" else "; too many to trust the run"))


def _speedup(base: np.ndarray, cand: np.ndarray, policy: GatePolicy, m: int) -> Criterion:
    """Ratio of mean per-request throughput cand/base (independent samples, delta method on log)."""
    b, c = np.asarray(base, float), np.asarray(cand, float)
    if b.size < 2 or c.size < 2 or b.mean() <= 0 or c.mean() <= 0:
        return Criterion("speedup", None, "not_evaluated", "at_least", policy.min_speedup, None,
                         detail="too few throughput samples")
    theta = math.log(c.mean() / b.mean())
    se = math.sqrt(c.var(ddof=1) / (c.size * c.mean() ** 2) + b.var(ddof=1) / (b.size * b.mean() ** 2))
    detail = f"{b.mean():.1f} → {c.mean():.1f} tok/s per request"
    if policy.min_speedup is None:
        q = float(stats.norm.ppf(1 - policy.alpha))
        return Criterion("speedup", None, "not_evaluated", "at_least", None, None, math.exp(theta),
                         math.exp(theta - q * se), math.exp(theta + q * se), 1 - 2 * policy.alpha,
                         n=b.size + c.size, detail=detail + "; min_speedup not set: reported only")
    crit = _one_sided("speedup", None, "at_least", math.log(policy.min_speedup), theta, se, math.inf,
                      b.size + c.size, policy, detail, m)
    return dataclasses.replace(crit, estimate=math.exp(theta), ci_low=math.exp(crit.ci_low),
                               ci_high=math.exp(crit.ci_high), bound_low=policy.min_speedup)


def _build(policy: GatePolicy, inputs: GateInputs, rng: np.random.Generator) -> list[Criterion]:
    """Every criterion before multiplicity adjustment."""
    m = len(inputs.accuracy) + 5  # family size estimate for n_more on the fail side
    out: list[Criterion] = []
    for arm, counts in (("baseline", inputs.base_requests), ("candidate", inputs.cand_requests)):
        out.append(_failed(arm, counts, policy) if counts is not None else Criterion(
            f"failed_rate_{arm}", None, "not_evaluated", "at_most", None, policy.max_failed_rate,
            detail="request counts not given"))
    out.extend(_accuracy(pairs, policy, m) for pairs in inputs.accuracy)
    if not inputs.accuracy:
        out.append(Criterion("accuracy", None, "not_evaluated", "at_least", -policy.accuracy_margin,
                             None, detail="no scored suite"))
    tp = inputs.tokens
    specs: list[tuple[str, float, Callable[[TokenPairs], np.ndarray], str]] = [
        ("kl_excess", policy.max_kl_excess, lambda t: t.kl_cand - t.kl_floor, "mean KL"),
        ("top1_loss", policy.max_top1_loss, lambda t: t.top1_floor - t.top1_cand, "same-top-1"),
    ]
    for name, bound, excess, label in specs:
        if tp is None or tp.kl_cand.size < 2:
            out.append(Criterion(name, None, "not_evaluated", "at_most", None, bound,
                                 detail="no teacher-forced pairs with an A/A floor"))
            continue
        values = excess(tp)
        arm, flr = (tp.kl_cand, tp.kl_floor) if name == "kl_excess" else (tp.top1_cand, tp.top1_floor)
        detail = f"{label} cand {arm.mean():.4g} vs A/A floor {flr.mean():.4g} over {values.size} items"
        if policy.bootstrap_resamples > 0:
            out.append(_bootstrap_at_most(name, values, tp.clusters, bound, policy, rng, detail, m))
        else:
            mc = st.mean_ci(values, tp.clusters)
            out.append(_one_sided(name, None, "at_most", bound, mc.estimate, mc.se, mc.df, values.size,
                                  policy, detail, m))
    out.append(_lengths(inputs.lengths, inputs.lengths_floor, policy, m) if inputs.lengths is not None
               else Criterion("length_ratio", None, "not_evaluated", "within", 1 - policy.max_length_drift,
                              1 + policy.max_length_drift, detail="no paired lengths"))
    if inputs.base_throughput is not None and inputs.cand_throughput is not None:
        out.append(_speedup(inputs.base_throughput, inputs.cand_throughput, policy, m))
    return out


def decide(policy: GatePolicy, inputs: GateInputs, rng: np.random.Generator) -> Verdict:
    """Judge every criterion, Holm-adjust the fail tests, and return the verdict."""
    drafts = _build(policy, inputs, rng)
    tested = [i for i, c in enumerate(drafts) if c.p_fail is not None]
    adjusted = st.holm_adjust([drafts[i].p_fail for i in tested])
    final = list(drafts)
    for i, p_adj in zip(tested, adjusted):
        c = drafts[i]
        if p_adj < policy.alpha:
            status: Status = "fail"
        elif c.status == "pass" or (c.p_pass is not None and c.p_pass < policy.alpha):
            status = "pass"
        else:
            status = c.status if c.status == "not_evaluated" else "inconclusive"
        final[i] = dataclasses.replace(c, p_fail_holm=float(p_adj), status=status)
    final = [c if c.status == "inconclusive" else dataclasses.replace(c, n_more=None) for c in final]
    return _verdict(policy, tuple(final))


def _label(c: Criterion) -> str:
    return f"{c.name}[{c.suite}]" if c.suite else c.name


def _verdict(policy: GatePolicy, criteria: tuple[Criterion, ...]) -> Verdict:
    """Combine statuses: any fail → FAIL; all evaluated pass → PASS; else INCONCLUSIVE."""
    failed = [c for c in criteria if c.status == "fail"]
    open_ = [c for c in criteria if c.status == "inconclusive"]
    passed = [c for c in criteria if c.status == "pass"]
    if failed:
        names = ", ".join(f"{_label(c)} (Holm p={c.p_fail_holm:.2g})" for c in failed)
        return Verdict("FAIL", criteria, f"shown outside its bound: {names}", policy)
    if open_:
        parts = [_label(c) + (f" (~{c.n_more} more items)" if c.n_more is not None else "") for c in open_]
        return Verdict("INCONCLUSIVE", criteria, "not decided: " + ", ".join(parts), policy)
    if not any(not c.name.startswith("failed_rate") for c in passed):
        return Verdict("INCONCLUSIVE", criteria, "no quality criterion could be evaluated", policy)
    return Verdict("PASS", criteria, f"all {len(passed)} evaluated criteria shown inside their bounds", policy)
