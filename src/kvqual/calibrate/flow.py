"""The two compares a calibration rests on: BASE vs GOOD and BASE vs BAD, through the compare
machinery itself (runner, teacher forcing, judge: `compare.flow.Compare`), each fixed-n over the
whole pool (one look: the narrowest intervals the suites allow, and no look plan to spend α over),
each written as an ordinary compare folder. A second calibration of the same targets judges the
saved answers again without starting a server (compare/earlier.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from kvqual import __version__
from kvqual.calibrate.derive import TOKEN_CRITERIA, derive_margin, interval_of
from kvqual.config import Config, RunDefaults, Target
from kvqual.errors import InfrastructureError
from kvqual.gate.origin import Calibration
from kvqual.judge.record import Judgement
from kvqual.news import say
from kvqual.suites import LoadedSuite


def _arm(j: Judgement, arm: str) -> dict[str, str | None]:
    """An arm as its server reported it: target, model, engine, KV dtype."""
    summary = j.runs[arm]
    assert summary is not None
    m = summary.manifest
    return {"target": m.target, "model": m.model, "engine": m.server_info.get("engine"),
            "kv_cache_dtype": m.server_info.get("kv_cache_dtype") or m.kv_cache_dtype}


def run_compare(config: Config, run: RunDefaults, suites: tuple[LoadedSuite, ...], base: Target, cand: Target,
                command: str) -> tuple[Judgement, Path]:
    """One fixed-n compare of `cand` against `base`, its reports written as `kvqual compare` writes them."""
    from kvqual.compare.earlier import remember
    from kvqual.compare.flow import Compare
    from kvqual.report import write_all

    fixed = replace(config, gate=replace(config.gate, looks=1))
    flow = Compare(fixed, run, suites, base, cand, teacher_forcing=True, allow_mismatch=False, rerun=False,
                   command=command)
    judgement = asyncio.run(flow.execute())
    s = flow.state
    assert s.bm is not None and s.cm is not None
    out = Path(run.results_dir) / f"compare-{s.bm.run_id}-vs-{s.cm.run_id}"
    write_all(judgement.to_json(), out)
    remember(flow, out)
    if judgement.verdict.infrastructure:
        raise InfrastructureError(f"{base.name} vs {cand.name}: {judgement.verdict.infrastructure} ({out})")
    return judgement, out


def calibrate(config: Config, run: RunDefaults, suites: tuple[LoadedSuite, ...], base: Target, good: Target,
              bad: Target, fraction: float, command: str) -> tuple[Calibration, list[str]]:
    """Both compares, then each token margin (gate/origin.py's `Calibration`), with notes to print."""
    judged: dict[str, Judgement] = {}
    for role, cand in (("good", good), ("bad", bad)):
        say(f"calibrate: {base.name} vs {cand.name} (known-{role}), fixed-n")
        judged[role], out = run_compare(config, run, suites, base, cand, command)
        say(f"calibrate: known-{role} judged: {out}")
    g, b = judged["good"], judged["bad"]
    n = min(g.sizes[-1], b.sizes[-1])
    level = g.verdict.criteria[0].level or config.gate.alpha
    margins = {name: derive_margin(name, interval_of(g.verdict.criteria, name), interval_of(b.verdict.criteria, name),
                                   fraction, n) for name in TOKEN_CRITERIA}
    notes: list[str] = []
    for name, m in margins.items():
        if m.good[2] >= m.margin:
            notes.append(f"{name}: the known-good's upper bound {m.good[2]:.3g} is above the margin {m.margin:.3g}: "
                         f"at {n} items even it would not PASS; a larger pool narrows its interval")
    acc = {role: interval_of(j.verdict.criteria, "accuracy_pooled") for role, j in judged.items()}
    if acc["bad"] is not None and acc["bad"][2] >= 0:
        notes.append(f"the known-bad's pooled accuracy {acc['bad'][0]:+.3f} [{acc['bad'][1]:+.3f}, {acc['bad'][2]:+.3f}] "
                     "is not shown below the baseline's: that it is bad rests on what you know of it")
    suite_names = tuple(f"{s.ref.name}:{s.ref.sha256[:12]}" for s in suites)
    cal = Calibration(
        source=command, created_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), kvqual_version=__version__,
        fraction=fraction, ci_level=round(1 - 2 * level, 6), items=n, suites=suite_names,
        baseline=_arm(g, "baseline"), good=_arm(g, "candidate"), bad=_arm(b, "candidate"),
        kl_excess=margins["kl_excess"], top1_loss=margins["top1_loss"],
        accuracy={k: v for k, v in acc.items() if v is not None} or None)
    return cal, notes
