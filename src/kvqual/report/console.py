"""The console summary of a comparison: the verdict and why, the criteria table in the report's
display units, and the lines people read first (teacher forcing, prompts that did not fit,
speed, capacity, warnings)."""

from __future__ import annotations

from typing import Any, Mapping

from kvqual.report.decision import decision
from kvqual.report.summary import (bounds_line, capacity_line, criterion_rows, fit_line, sequential_line, tail_line,
                                    teacher_line)


def verdict_line(report: Mapping[str, Any]) -> str:
    """The first line: the verdict and the gate's reason; an infrastructure stop in one short line
    naming what failed (each criterion's detail is in the report, not repeated here)."""
    v = report["verdict"]
    if not v.get("infrastructure"):
        return f"{v['verdict']}: {v['reason']}"
    hit = [c["label"] for c in v["criteria"] if c.get("infrastructure") and c.get("status") != "pass"]
    return (f"{v['verdict']} (infrastructure, exit 4): requests failed after their retries "
            f"({', '.join(hit) or 'the run'}); run the same command again to retry them (details in report.md)")


def console_summary(report: Mapping[str, Any]) -> str:
    """The summary `compare` and `report` print (stdout; stderr with --json)."""
    v = report["verdict"]
    lines = [verdict_line(report), f"next: {decision(report).next_step}"]
    for line in (teacher_line(report), tail_line(report), fit_line(report)):
        if line:
            lines.append(line)
    slower = (report.get("speed") or {}).get("slower")
    if slower:
        lines.append(f"note: {slower}")
    # the report's display units (points, nats/token, ×, %; three significant figures); the level once
    rows = criterion_rows(report)
    levels = sorted({c["ci_level"] for c in v["criteria"] if c.get("ci_level")})
    width = max([len(c["label"]) for c in v["criteria"]] + [20]) + 2
    lines += ["", f"{'criterion':<{width}}{'role':<9}{'estimate':>18}  {'interval':<26}{'bound':<22}status"
              + (f"   ({' / '.join(f'{x:.0%}' for x in levels)} intervals)" if levels else "")]
    groups = {"primary": "primary: each must be shown inside its bound for PASS",
              "guard": "guards: one shown outside fails the candidate; undecided ones do not block PASS",
              "health": "run health: passes when the observed failure rate is within its bound"}
    for group, heading in groups.items():
        members = [(c, row) for c, row in zip(v["criteria"], rows)
                   if ("health" if c["name"].startswith("failed_rate") else c["role"]) == group]
        if members:
            lines.append(f"  {heading}")
        for c, row in members:
            ci = row.ci.rsplit(" (", 1)[0]
            lines.append(f"{c['label']:<{width}}{c['role']:<9}{row.estimate:>18}  {ci:<26}{row.bound:<22}"
                         f"{c['status'].upper()}{'†' if row.holm else ''}")
    lines += [f"† {c['label']}: {row.holm}" for c, row in zip(v["criteria"], rows) if row.holm]
    ov = report["suites"].get("overall", {})
    gen, tok = (ov.get("generation") or {}).get("ab"), (ov.get("teacher") or {}).get("ab")
    if gen:
        ratio = "—" if gen["len_ratio"] is None else f"{gen['len_ratio']:.2f}×"
        lines.append(f"\nexact outputs {gen['exact_rate']:.1%}, length ratio {ratio}, n={gen['n']} pairs")
    if tok:
        lines.append(f"teacher-forced: mean KL {tok['mean_kl']:.3g} nats/token (token mean), same top-1 "
                     f"{tok['same_top1_rate']:.1%} over {tok['n_tokens']} tokens")
    seq = sequential_line(report)
    if seq:
        lines.append(seq)
    bounds = bounds_line(report)
    if bounds:
        lines.append(bounds)
    cap = capacity_line(report)
    if cap:
        lines.append(cap)
    if report.get("speed"):
        s = report["speed"]
        r = s["ratio"]
        ratio = "" if r.get("estimate") is None or s.get("apart_s") is not None else (
            f"; per-request tok/s ratio {r['estimate']:.3g} [{r['ci_low']:.3g}, {r['ci_high']:.3g}]")
        lines.append(f"speed: {s['baseline']['output_tok_s']:.3g} → {s['candidate']['output_tok_s']:.3g} output "
                     f"tok/s at concurrency {s['candidate']['concurrency']}{ratio}"
                     + (f" — {s['note']}" if s.get("note") else ""))
    steady = report.get("steady_speed")
    if steady:  # --speed-from: what the speedup criterion read
        r, arms = steady["ratio"], steady["arms"]
        ci = "" if r.get("low") is None else f" [{r['low']:.3g}, {r['high']:.3g}] ({r['level']:.0%}, Fieller)"
        lines.append(f"steady speed at saturation ({steady['source']}): {arms['baseline']['output_tok_s']:.4g} → "
                     f"{arms['candidate']['output_tok_s']:.4g} output tok/s at concurrency {steady['concurrency']}; "
                     f"ratio {r['estimate']:.3g}{ci}")
    for w in report.get("warnings", []):
        lines.append(f"warning: {w}")
    return "\n".join(lines)
