"""The report dict (report.json, schema 1) turned into display rows shared by every format.

Markdown, HTML and JUnit all show the same facts; this module decides once how a value
reads, so the formats cannot disagree: "—" for null, three significant figures, a criterion
in the units people read (accuracy and rate differences in points, KL in nats per token,
ratios as "1.04×", failure rates in %), bounds as "≥ −5 points", CIs as "[a, b]".
Pure functions over the dict: nothing here does I/O, and every value may be null.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from kvqual.report.fmt import (MISSING, NOT_MEASURED, num, get, sig3, fmt_num, quantity, fmt_quantity, fmt_quantity_interval, fmt_pct, fmt_interval, fmt_time, fmt_scale, fmt_bound)
# the one-line facts and the trajectory: their own module, their names here too
from kvqual.report.lines import (TAIL_HEADER, bounds_line, capacity_line, exit_code, fit_line,  # noqa: F401
                                 sequential_line, tail_line, tail_rows, teacher_line, title, trajectory_rows,
                                 verdict_line)

SCHEMA_VERSION = 1


CRITERION_LABEL = {
    "accuracy": "accuracy difference (cand − base)",
    "accuracy_pooled": "accuracy difference, all suites (stratified)",
    "truncation_excess": "truncation rate beyond A/A floor",
    "loop_excess": "repetition-loop rate beyond A/A floor",
    "distinct2_loss": "distinct-2 diversity lost beyond A/A floor",
    "length_ks_excess": "length-distribution KS distance beyond A/A floor",
    "length_ratio": "output length ratio (cand / base)",
    "length_mean_ratio": "mean output length ratio (cand / base)",
    "kl_excess": "mean KL beyond A/A floor",
    "top1_loss": "same-top-1 loss beyond A/A floor",
    "broken_share": "share of prompts broken beyond A/A floor",
    "failed_rate_base": "failed-request rate, baseline",
    "failed_rate_cand": "failed-request rate, candidate",
    "failed_rate_baseline": "failed-request rate, baseline",
    "failed_rate_candidate": "failed-request rate, candidate",
    "speedup": "throughput ratio (cand / base)",
    "cache_path": "cache path: warm − cold KL per shared context",
}


@dataclass(frozen=True)
class CriterionRow:
    """One gate criterion as display strings (plus the raw status for styling)."""

    name: str
    label: str
    suite: str
    estimate: str
    ci: str
    bound: str
    status: str
    detail: str
    n: str
    n_more: str
    role: str = "primary"
    unit: str = "items"
    holm: str | None = None  # why an interval wholly outside its bound is not a FAIL (`holm_note`)


@dataclass(frozen=True)
class ArmRow:
    """One row of the 'what was compared' table: a field across baseline/candidate/A/A."""

    label: str
    baseline: str
    candidate: str
    aa: str


@dataclass(frozen=True)
class SuiteRow:
    """One suite: size, hash and how many pairs back the A/B comparison and the A/A floor."""

    name: str
    n_items: str
    sha256: str
    ab_pairs: str
    aa_pairs: str
    dropped_pairs: str


@dataclass(frozen=True)
class MetricRow:
    """One metric of one suite, A/B next to its A/A floor."""

    suite: str
    metric: str
    ab: str
    aa: str


def shown_slower(report: Mapping[str, Any]) -> bool:
    """The candidate shown slower than the baseline: report.json's `speed.slower` (the speed
    ratio's whole interval below 1); in older reports without the key, the same rule."""
    speed = report.get("speed") or {}
    if "slower" in speed:
        return bool(speed["slower"])
    high = num(get(speed, "ratio", "ci_high"))
    return high is not None and high < 1


def criterion_rows(report: Mapping[str, Any]) -> list[CriterionRow]:
    """Every criterion of the verdict, in the order the gate listed them."""
    rows = []
    for c in get(report, "verdict", "criteria") or []:
        status = str(c.get("status") or "not_evaluated")
        level = c.get("ci_level")
        name = str(c.get("name") or "?")
        q = quantity(name)
        ci = fmt_quantity_interval(c.get("ci_low"), c.get("ci_high"), q)
        if ci != MISSING and isinstance(level, (int, float)):
            ci = f"{ci} ({level:.0%})"
        rows.append(
            CriterionRow(
                name=name,
                label=CRITERION_LABEL.get(name, name),
                suite=str(c.get("suite") or "overall"),
                estimate=fmt_quantity(c.get("estimate"), q),
                ci=ci,
                bound=fmt_bound(c),
                status=status,
                detail=str(c.get("detail") or ""),
                n=fmt_num(c.get("n")),
                n_more=fmt_num(c.get("n_more")),
                role=str(c.get("role") or "primary"),
                unit=str(c.get("unit") or "items"),
                holm=holm_note(c),
            )
        )
    return rows


def holm_note(c: Mapping[str, Any]) -> str | None:
    """Why an undecided criterion whose interval lies wholly outside its bound is not a FAIL: its
    fail test, adjusted by Holm over every criterion's fail test (so the false-FAIL rate holds
    over all of them), is not below the level; None for every other criterion."""
    if c.get("status") != "inconclusive":
        return None
    lo, hi, bl, bh = (num(c.get(k)) for k in ("ci_low", "ci_high", "bound_low", "bound_high"))
    outside = {"at_least": hi is not None and bl is not None and hi < bl,
               "at_most": lo is not None and bh is not None and lo > bh,
               "within": (hi is not None and bl is not None and hi < bl) or (lo is not None and bh is not None and lo > bh)}
    if not outside.get(str(c.get("direction")), False):
        return None
    adjusted, level = num(c.get("p_fail_holm")), num(c.get("level"))
    test = (f": its fail test's p-value {sig3(num(c.get('p_fail')) or 0.0)} is "
            f"{sig3(adjusted)} after Holm's adjustment over every criterion, above the level {sig3(level)}"
            if adjusted is not None and level is not None else ", but its fail test does not survive Holm's "
            "adjustment over every criterion")
    return f"outside its bound before the multiple-testing adjustment{test}: not shown outside, so not a FAIL"


def _run_value(run: Any, key: str) -> str:
    if run is None:
        return MISSING
    value = run.get(key)
    if key == "base_urls":
        return ", ".join(str(u) for u in value) if value else MISSING
    if key in ("started_at", "finished_at"):
        return fmt_time(value)
    if key in ("kv_scale", "reported_kv_dtype", "kv_fault", "engine", "attention_backend",
               "kv_capacity_tokens") and value is None:
        return "not reported"
    if key == "kv_scale":
        return fmt_scale(value)
    return fmt_num(value) if not isinstance(value, str) else value


_ARM_FIELDS = (
    ("target", "Target"),
    ("model", "Model"),
    ("kv_cache_dtype", "KV cache dtype (configured)"),
    ("reported_kv_dtype", "KV cache dtype (server-reported)"),
    ("kv_scale", "KV scale (server-reported)"),
    ("kv_fault", "KV fault mode (kvqual serve)"),
    ("engine", "Engine (detected)"),
    ("attention_backend", "Attention backend (server-reported)"),
    ("kv_capacity_tokens", "KV capacity (tokens, server-reported)"),
    ("ok", "Requests ok"),
    ("failed", "Requests failed"),
    ("run_id", "Run id"),
    ("base_urls", "Server"),
    ("started_at", "Started"),
    ("finished_at", "Finished"),
)


def arm_rows(report: Mapping[str, Any]) -> list[ArmRow]:
    """The 'what was compared' table: one row per run field, one column per arm."""
    runs = report.get("runs") or {}
    base, cand, aa = runs.get("baseline"), runs.get("candidate"), runs.get("aa")
    rows = []
    for key, label in _ARM_FIELDS:
        aa_value = _run_value(aa, key) if aa is not None else NOT_MEASURED
        rows.append(ArmRow(label, _run_value(base, key), _run_value(cand, key), aa_value))
    return rows


def _max_pairs(suite: Mapping[str, Any], arm: str) -> Any:
    counts = [get(suite, kind, arm, "n_items" if kind == "teacher" else "n")
              for kind in ("task", "generation", "teacher")]
    counts = [c for c in counts if isinstance(c, int)]
    return max(counts) if counts else None


def suite_rows(report: Mapping[str, Any]) -> list[SuiteRow]:
    """Suites of the baseline run with size and hash, plus paired counts A/B and A/A."""
    suites = report.get("suites") or {}
    listed = get(report, "runs", "baseline", "suites") or []
    names = [s.get("name") for s in listed] + [n for n in suites if n != "overall"]
    rows, seen = [], set()
    for name in names:
        if name is None or name in seen:
            continue
        seen.add(name)
        info = next((s for s in listed if s.get("name") == name), {})
        block = suites.get(name) or {}
        pairs = get(block, "reliability", "pairs")
        sha = info.get("sha256")
        aa_pairs = _max_pairs(block, "aa")
        no_aa = get(report, "runs", "aa") is None
        rows.append(
            SuiteRow(
                name=str(name),
                n_items=fmt_num(info.get("n_items")),
                sha256=str(sha)[:12] if sha else MISSING,
                ab_pairs=fmt_num(pairs if pairs is not None else _max_pairs(block, "ab")),
                aa_pairs=NOT_MEASURED if aa_pairs is None and no_aa else fmt_num(aa_pairs),
                dropped_pairs=fmt_num(get(block, "reliability", "dropped_pairs")),
            )
        )
    return rows


def _points(value: Any) -> str:
    return fmt_quantity(value, "points")


def _ratio(value: Any) -> str:
    return fmt_quantity(value, "ratio")


def _nats(value: Any) -> str:
    return fmt_quantity(value, "nats")


_METRICS = (
    ("task", "acc_base", "accuracy, baseline", fmt_pct),
    ("task", "acc_cand", "accuracy, candidate", fmt_pct),
    ("task", "diff", "accuracy difference (cand − base)", _points),
    ("task", "flips_right_to_wrong", "flips right→wrong", fmt_num),
    ("task", "flips_wrong_to_right", "flips wrong→right", fmt_num),
    ("task", "mcnemar_p", "McNemar p", fmt_num),
    ("generation", "exact_rate", "byte-identical outputs", fmt_pct),
    ("generation", "first_div_median", "median first-divergence token", fmt_num),
    ("generation", "len_ratio", "output length ratio (mean cand / mean base)", _ratio),
    ("generation", "wilcoxon_p", "length Wilcoxon p", fmt_num),
    ("generation", "len_quantiles", "output length p50 / p90 / p99 (base → cand)", None),
    ("generation", "distinct2_diff", "distinct-2 diversity (cand − base)", None),
    ("generation", "loops_cand", "repetition loops (cand)", fmt_pct),
    ("generation", "trunc_cand", "truncated at max_tokens (cand)", fmt_pct),
    ("teacher", "mean_kl", "mean KL(base‖cand), token mean", _nats),
    ("teacher", "p99_kl", "p99 KL per token", _nats),
    ("teacher", "same_top1_rate", "same top-1 token", fmt_pct),
)


def metric_rows(report: Mapping[str, Any]) -> list[MetricRow]:
    """Headline metrics per suite ('overall' first), A/B beside the A/A floor."""
    suites = report.get("suites") or {}
    order = (["overall"] if "overall" in suites else []) + sorted(n for n in suites if n != "overall")
    rows = []
    for name in order:
        block = suites[name] or {}
        for kind, key, label, fmt in _METRICS:
            if fmt is None:  # composite rows
                ab, aa = (_COMPOSITE[key](get(block, kind, side)) for side in ("ab", "aa"))
                if ab is not None or aa is not None:
                    rows.append(MetricRow(str(name), label, ab or MISSING, aa or MISSING))
                continue
            ab, aa = get(block, kind, "ab", key), get(block, kind, "aa", key)
            if ab is None and aa is None:
                continue
            text_ab, text_aa = fmt(ab), fmt(aa)
            if key in ("diff", "len_ratio"):
                q = "points" if key == "diff" else "ratio"
                ab_ci = fmt_quantity_interval(*(get(block, kind, "ab", f"{key}_ci") or [None, None])[:2], q)
                text_ab += "" if ab_ci == MISSING else f" {ab_ci}"
            if key == "len_ratio":
                text_ab += _mean_lengths(get(block, kind, "ab"))
                text_aa += _mean_lengths(get(block, kind, "aa"))
            rows.append(MetricRow(str(name), label, text_ab, text_aa))
    return rows


def _length_quantiles(block: Any) -> str | None:
    """'12 → 13 / 60 → 61 / 240 → 256 tokens': p50 / p90 / p99 of both arms' output lengths."""
    parts = []
    for q in (50, 90, 99):
        b, c = get(block, f"len_base_p{q}"), get(block, f"len_cand_p{q}")
        if b is None or c is None:
            return None
        parts.append(f"{fmt_num(float(b))} → {fmt_num(float(c))}")
    return " / ".join(parts) + " tokens"


def _distinct2(block: Any) -> str | None:
    """'−0.0120 [−0.0300, +0.00500] (0.812 → 0.800)': the paired difference of distinct-2."""
    d = get(block, "distinct2_diff")
    if d is None:
        return None
    lo, hi = (get(block, "distinct2_diff_ci") or [None, None])[:2]
    ci = "" if lo is None or hi is None else f" [{sig3(lo, signed=True)}, {sig3(hi, signed=True)}]"
    return (f"{sig3(d, signed=True)}{ci} ({fmt_num(float(get(block, 'distinct2_base')))} → "
            f"{fmt_num(float(get(block, 'distinct2_cand')))}, {get(block, 'distinct2_n')} pairs)")


_COMPOSITE = {"len_quantiles": _length_quantiles, "distinct2_diff": _distinct2}


def _mean_lengths(block: Any) -> str:
    """' (27.9 → 28.9 tokens)': the mean output lengths behind a length ratio."""
    lb, lc = get(block, "len_base_mean"), get(block, "len_cand_mean")
    if lb is None or lc is None:
        return ""
    return f" ({fmt_num(float(lb))} → {fmt_num(float(lc))} tokens)"


def speed_rows(report: Mapping[str, Any]) -> list[ArmRow]:
    """Throughput and latency of both arms (the A/A column holds the ratio); [] if unmeasured."""
    speed = report.get("speed")
    if not speed:
        return []
    fields = (
        ("output_tok_s", "output tokens/s"),
        ("req_s", "requests/s"),
        ("latency_p50", "latency p50 (s)"),
        ("latency_p95", "latency p95 (s)"),
        ("ttft_p50", "time to first token p50 (s)"),
        ("ttft_p95", "time to first token p95 (s)"),
        ("itl_p50", "inter-token latency p50 (s)"),
        ("itl_p95", "inter-token latency p95 (s)"),
        ("concurrency", "concurrency"),
    )
    server_fields = (
        ("gen_tok_s", "server: generated tokens/s"),
        ("kv_usage_peak", "server: KV cache usage peak"),
        ("kv_usage_mean", "server: KV cache usage mean"),
        ("running_peak", "server: running requests peak"),
        ("prefix_hit_rate", "server: prefix-cache hit rate (prompt tokens)"),
        ("host_hits", "server: prompt tokens served from the host tier"),
        ("cache_hit_rate_peak", "server: cache hit rate (gauge, peak)"),
        ("ttft_mean_s", "server: time to first token mean (s)"),
        ("itl_mean_s", "server: inter-token latency mean (s)"),
    )
    rows = [
        ArmRow(label, fmt_num(get(speed, "baseline", k)), fmt_num(get(speed, "candidate", k)), "")
        for k, label in fields
        if get(speed, "baseline", k) is not None or get(speed, "candidate", k) is not None
    ]
    rows += [
        ArmRow(label, fmt_num(get(speed, "baseline", "server", k)), fmt_num(get(speed, "candidate", "server", k)), "")
        for k, label in server_fields
        if get(speed, "baseline", "server", k) is not None or get(speed, "candidate", "server", k) is not None
    ]
    ratio = speed.get("ratio") or {}
    ci = fmt_interval([ratio.get("ci_low"), ratio.get("ci_high")])
    rows.append(ArmRow("throughput ratio (cand / base)", fmt_num(ratio.get("estimate")), ci, ""))
    return rows
