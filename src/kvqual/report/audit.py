"""An audit's report.json as people read it: the console summary and report.md (docs/audit.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from kvqual.report.markdown import cell, table
from kvqual.report.summary import criterion_rows


def _num(x: Any, fmt: str = ".4g") -> str:
    return "—" if x is None else format(x, fmt)


def _interval(block: Mapping[str, Any] | None, scale: float = 1.0, fmt: str = "+.3g") -> str:
    if not block:
        return "—"
    return (f"{block['estimate'] * scale:{fmt}} [{block['low'] * scale:{fmt}}, {block['high'] * scale:{fmt}}] "
            f"({block['level']:.0%}, {block['clusters']} prompts)")


def lines(report: Mapping[str, Any]) -> list[str]:
    """The figures under the verdict, one line each (console and markdown share them)."""
    f, src = report["figures"], report["outputs"]
    lp, top = f["mean_logprob"], f["same_top1_with_reference"]
    out = [f"audited {f['units']} of {src['lines']:,} outputs in {src['path']} (seeded sample, stratified over "
           f"{len(src['strata'])} strata); {f['tokens_scored']:,} audited tokens and {f['floor_tokens_scored']:,} "
           f"floor tokens scored on {report['reference']}"
           + (f"; {f['aligned_by_text']} of them aligned by text ({report['reference']} gave no token ids: no "
              "/tokenize, none in the file)" if f.get("aligned_by_text") else ""),
           f"mean log-probability a token under {report['reference']}: audited {_num(lp['audited'])}, its own outputs "
           f"{_num(lp['floor'])}; difference {_interval(lp['difference'])} nats",
           f"tokens that are {report['reference']}'s top-1: audited {_num(top['audited'], '.2%')}, its own outputs "
           f"{_num(top['floor'], '.2%')}; difference {_interval(top['difference'], 100)} points"]
    cand = f.get("candidate")
    if cand:
        out.append(f"{report['candidate']} vs {report['reference']} on the audited tokens: mean KL "
                   f"{_num(cand['mean_kl'])} nats/token (token mean), same top-1 {_num(cand['same_top1'], '.2%')}, "
                   f"{cand['pairs']} outputs; A/A floor: {cand['floor']}")
    out.append(f"stop: {report['sequential']['stop']}")
    return out


def console(report: Mapping[str, Any]) -> str:
    v = report["verdict"]
    text = [f"{v['verdict']}: {v['reason']}", *lines(report), ""]
    width = max([len(c["label"]) for c in v["criteria"]] + [20]) + 2
    text.append(f"{'criterion':<{width}}{'role':<9}{'estimate':>20}  {'interval':<28}{'bound':<22}status")
    for c, row in zip(v["criteria"], criterion_rows(report)):
        ci = row.ci.rsplit(" (", 1)[0]
        text.append(f"{c['label']:<{width}}{c['role']:<9}{row.estimate:>20}  {ci:<28}{row.bound:<22}"
                    f"{c['status'].upper()}")
    drifted = report["figures"]["most_drifted"][:3]
    if drifted:
        text.append(f"\nleast likely under {report['reference']} (report.md lists {len(report['figures']['most_drifted'])}):")
        text += [f"  {d['id']} (line {d['line']}): {_num(d['mean_logprob'])} nats/token (its own output "
                 f"{_num(d['floor_mean_logprob'])}): {d['completion'][:100]!r}" for d in drifted]
    return "\n".join(text)


def markdown(report: Mapping[str, Any]) -> str:
    v = report["verdict"]
    md = [f"# kvqual audit: {v['verdict']}", "", f"**{v['verdict']}**: {cell(v['reason'])}", "",
          f"Outputs `{report['outputs']['path']}` judged against `{report['reference']}`"
          + (f" and `{report['candidate']}`" if report.get("candidate") else "") + f". Command: `{report['command']}`", ""]
    md += [f"- {cell(line)}" for line in lines(report)]
    md += ["", "## Criteria", ""]
    md += table(["criterion", "role", "estimate", "interval", "bound", "status", "detail"],
                [[r.label, r.role, r.estimate, r.ci, r.bound, r.status.upper(), r.detail]
                 for r in criterion_rows(report)])
    md += ["", "## By position in the completion", ""]
    md += table(["tokens", "n", "top-1 audited", "top-1 own", "log-prob audited", "log-prob own"]
                + (["KL vs candidate"] if report.get("candidate") else []),
                [[f"{b['start']}–{b['end'] - 1 if b['end'] else ''}", b["n_tokens"], _num(b["same_top1"], ".2%"),
                  _num(b["floor_same_top1"], ".2%"), _num(b["mean_logprob"]), _num(b["floor_mean_logprob"])]
                 + ([_num(b.get("mean_kl"))] if report.get("candidate") else [])
                 for b in report["figures"]["by_position"]])
    md += ["", f"## The outputs {report['reference']} found least likely", ""]
    md += table(["id", "line", "log-prob a token", "own output", "least likely token", "completion (start)"],
                [[d["id"], d["line"], d["mean_logprob"], d["floor_mean_logprob"],
                  f"#{d['lowest_position']}: {d['lowest_logprob']}", d["completion"][:160]]
                 for d in report["figures"]["most_drifted"]])
    md += ["", "What these figures mean and do not mean: docs/audit.md.", ""]
    return "\n".join(md)


def write(report: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md"}
    paths["json"].write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    paths["md"].write_text(markdown(report), encoding="utf-8")
    return paths
