"""The report dict's one-line facts (title, verdict, exit code, teacher forcing, prompts that did
not fit, KV capacity, where the looks stopped) and the primary criteria's trajectory over the looks.
Pure functions over the dict, shared by every format; report/summary.py re-exports them."""

from __future__ import annotations

import math

from collections.abc import Mapping
from typing import Any

from kvqual.report.fmt import fmt_num, fmt_quantity, fmt_quantity_interval, get, quantity


def title(report: Mapping[str, Any]) -> str:
    """'bf16 → fp8': the change under test, in the order `kvqual compare BASELINE CANDIDATE` names it."""
    base = get(report, "runs", "baseline", "target") or "baseline"
    cand = get(report, "runs", "candidate", "target") or "candidate"
    return f"{base} → {cand}"


def verdict_line(report: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, reason) with safe defaults when the verdict is missing."""
    verdict = str(get(report, "verdict", "verdict") or "UNKNOWN")
    reason = str(get(report, "verdict", "reason") or "no reason given")
    return verdict, reason


def exit_code(report: Mapping[str, Any]) -> str:
    """The exit code the gate returned, as text ('—' when absent)."""
    return fmt_num(get(report, "verdict", "exit_code"))


def teacher_line(report: Mapping[str, Any]) -> str | None:
    """One line on teacher forcing: off, or how many pairs the token criteria rest on and why the
    rest were left out (shown right under the verdict: a missing criterion must be visible)."""
    tf = report.get("teacher_forcing") or {}
    if not tf.get("requested", tf.get("enabled")):
        return "teacher forcing OFF (--no-teacher-forcing): the token-level criteria were not evaluated"
    pairs, usable = tf.get("pairs") or 0, tf.get("usable") or 0
    if not pairs:
        return tf.get("note")
    left = tf.get("left_out") or {}
    why = "; left out: " + ", ".join(f"{r} ({k})" for r, k in left.items()) if left else ""
    methods = tf.get("methods") or {}
    how = ""
    if methods.get("text"):
        how = f" — {methods['text']} scored by text alignment (the server gave no token ids), {methods.get('ids', 0)} by exact token ids"
    elif methods.get("ids"):
        how = " — exact token ids"
    chunked = tf.get("chunked") or 0
    windows = (f"; {chunked} longer than the server admits, scored in windows (docs/longgen.md)"
               if chunked else "")
    # rounded down to 0.1%, as the gate words it: 79 of 99 read "(80%)" beside a gate saying 79.7% < 80%
    share = f"{math.floor(usable / pairs * 1000) / 10:g}%"
    return f"teacher forcing: token metrics on {usable} of {pairs} pairs ({share}){how}{windows}{why}"


def fit_line(report: Mapping[str, Any]) -> str | None:
    """Prompts a server refused as longer than its context: left out of both arms, never failures."""
    unfit = report.get("does_not_fit") or {}
    n = unfit.get("items") or 0
    if not n:
        return None
    limit = unfit.get("limit")
    where = f"a {int(limit):,}-token context" if limit else "the server's context"
    ids = unfit.get("ids") or []
    shown = ", ".join(ids[:3]) + (", …" if n > 3 else "")
    return (f"{n} prompt{'s' if n != 1 else ''} do{'' if n != 1 else 'es'} not fit {where} (prompt + max_tokens): "
            f"left out of both arms, not counted as failures, so the criteria count {n} fewer items than the "
            f"looks judged ({shown})")


def capacity_line(report: Mapping[str, Any]) -> str | None:
    """KV capacity of both arms as their servers report it, and the ratio (what fp8 buys)."""
    from kvqual.capacity import sentence

    return sentence(report.get("capacity") or {})


def sequential_line(report: Mapping[str, Any]) -> str | None:
    """Where a sequential compare stopped and the level each look tested at."""
    seq = get(report, "verdict", "sequential") or {}
    if not seq.get("looks"):
        return None
    if seq.get("planned_looks") == 1:
        return f"fixed-n: judged once on {(seq.get('sizes') or ['?'])[-1]} items at α = {fmt_num(seq.get('nominal_alpha'))}"
    return (f"sequential: {seq.get('stop')}; each look tested at the Pocock nominal level "
            f"α′ = {fmt_num(seq.get('nominal_alpha'))} ({seq.get('planned_looks')} planned looks)")


def bounds_line(report: Mapping[str, Any]) -> str | None:
    """Where the bounds came from, in one line (report.json's `provenance`): the token bounds and the
    accuracy margin always, any other bound only when it is not the built-in default."""
    bounds = get(report, "provenance", "bounds") or {}
    if not bounds:
        return None
    always = ("max_kl_excess", "max_top1_loss", "accuracy_margin")
    parts = [f"{f} {fmt_num(b.get('value'))} ({b.get('text')})" for f, b in bounds.items()
             if isinstance(b, Mapping) and (f in always or b.get("source") != "built-in")]
    return "bounds: " + "; ".join(parts) if parts else None


def trajectory_rows(report: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The primary criteria's intervals at each look: (header, rows)."""
    seq = get(report, "verdict", "sequential") or {}
    looks = seq.get("looks") or []
    primary = [(c.get("label") or (f"{c['name']}[{c['suite']}]" if c.get("suite") else c["name"]), str(c["name"]))
               for c in get(report, "verdict", "criteria") or []
               if c.get("role", "primary") == "primary" and c.get("status") != "not_evaluated"
               and not str(c.get("name", "")).startswith("failed_rate")]
    rows = []
    for look in looks:
        row = [str(look.get("look")), str(look.get("items")), str(look.get("verdict"))]
        for label, name in primary:
            c = (look.get("criteria") or {}).get(label) or {}
            q = quantity(name)
            ci = fmt_quantity_interval(c.get("ci_low"), c.get("ci_high"), q)
            row.append(f"{fmt_quantity(c.get('estimate'), q)} {ci} {c.get('status', '')}".strip())
        rows.append(row)
    return ["look", "items", "verdict"] + [label for label, _ in primary], rows


def tail_line(report: Mapping[str, Any]) -> str | None:
    """One line on the per-prompt tail a mean hides (report.json `tail`): the per-prompt KL's p50,
    p99 and maximum, how many prompts broke (and in the A/A floor), and the worst prompts by id."""
    t = report.get("tail")
    if not t:
        return None
    kl, miss = t.get("kl") or {}, t.get("top1_disagreement") or {}
    unusable = t.get("unusable_count") or 0
    broken = (f"{t['broken']} broken (mean KL above {t['broken_kl']:g} nats/token"
              + (f", {unusable} of them answers that were not data" if unusable else "")
              + f"), {t.get('broken_floor', 0)} in the A/A floor")
    worst = ", ".join(f"{w['suite']}/{w['id']} ({fmt_num(w['kl'])})" for w in (t.get("worst") or [])[:3])
    return (f"per prompt over {t['prompts']} prompts: KL p50 {fmt_num(kl.get('p50'))}, p99 {fmt_num(kl.get('p99'))}, "
            f"max {fmt_num(kl.get('max'))} nats/token; top-1 disagreement p99 {fmt_num(miss.get('p99'))}, "
            f"max {fmt_num(miss.get('max'))}; {broken}" + (f"; worst: {worst}" if worst else ""))


TAIL_HEADER = ["Prompt", "KL (nats/token)", "A/A KL", "Same top-1", "Baseline output", "Candidate output"]


def tail_rows(report: Mapping[str, Any]) -> list[list[str]]:
    """The worst prompts by KL, then every candidate answer that was not data, as table rows."""
    t = report.get("tail") or {}
    rows = [[f"{w['suite']}/{w['id']}" + (f" #{w['repeat']}" if w.get("repeat") else "") + (" (broken)" if w.get("broken") else ""),
             fmt_num(w.get("kl")), fmt_num(w.get("kl_floor")), fmt_num(w.get("same_top1")),
             (w.get("base_text") or "").strip()[:80], (w.get("cand_text") or "").strip()[:80]]
            for w in t.get("worst") or []]
    rows += [[f"{u['suite']}/{u['id']} (broken)", "—", "—", "—", "", f"not data: {u.get('error') or ''}"[:120]]
             for u in t.get("unusable") or []]
    return rows
