"""What the judge hands on: typed values, turned into report.json's dicts once, at the edge.

`LookPlan` is the sequential compare's schedule of looks (which the compare planned, which it took,
why it stopped); `RunSummary` is one arm's run as the report shows it (its server's own report
included); `Judgement` holds the gate's `Verdict` whole beside them and the report's other sections.
`Judgement.to_json()` is report.json; nothing patches the verdict after the gate decides it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from kvqual.gate import GatePolicy, Verdict
from kvqual.records import RunManifest


@dataclass(frozen=True)
class LookPlan:
    """The looks of a sequential compare: `sizes[k]` items of the seeded order judged at look k.

    `planned` is the whole schedule; `sizes` the looks the compare reached (shorter than `planned`
    when a budget stopped it, `stop` saying why in words, `budget` which budget as a field:
    "max_minutes" or "budget_tokens"); `next_look` the price of the look a budget stopped before;
    `overlap`: a round's parts shared one server (speed figures are indicative); `earlier`: the arms
    ("baseline", "candidate") whose answers all came from runs before this compare (reused, none sent)."""

    pool: int
    sizes: tuple[int, ...]
    planned: tuple[int, ...] = ()
    stop: str | None = None
    overlap: bool = False
    next_look: Mapping[str, Any] | None = None
    budget: str | None = None
    earlier: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(self.sizes))
        object.__setattr__(self, "planned", tuple(self.planned or self.sizes))

    @classmethod
    def geometric(cls, pool: int, policy: GatePolicy) -> "LookPlan":
        """The gate's own schedule over `pool` items (`kvqual report` with no compare's plan)."""
        from kvqual.gate import look_sizes

        return cls(pool, tuple(look_sizes(pool, policy.looks, policy.first_look)))

    @classmethod
    def from_report(cls, seq: Mapping[str, Any], policy: GatePolicy) -> "LookPlan | None":
        """The plan a report.json's `verdict.sequential` records; None when it records none or was
        planned for other `looks` / `first_look` than `policy`'s (then the plan is derived again)."""
        if not seq.get("sizes") or (seq.get("max_looks"), seq.get("first_look")) != (policy.looks, policy.first_look):
            return None
        stop = seq.get("stop") or ""
        return cls(seq["pool"], tuple(seq["sizes"]), tuple(seq.get("planned") or seq["sizes"]),
                   stop.split(": ", 1)[1] if ": " in stop and stop.startswith("stopped") else None,
                   bool(seq.get("overlap")), seq.get("next_look"), seq.get("budget"), tuple(seq.get("earlier") or ()))

    def stop_reason(self, verdict: str, taken: int, sizes: list[int]) -> str:
        """Why the sequential compare stopped where it did, in words."""
        planned = len(self.planned)
        if verdict != "INCONCLUSIVE":
            return f"decided at look {taken} of {planned} ({sizes[taken - 1]} of {self.pool} items)"
        if self.stop:
            return f"stopped at look {taken} of {planned} ({sizes[taken - 1]} items): {self.stop}"
        return f"the pool is spent: all {sizes[taken - 1]} items judged at look {taken} of {planned}"


def attention_backend(m: RunManifest) -> str | None:
    """The attention backend the server reports (SGLang's /get_server_info lists its server args), or None."""
    si = m.server_info.get("server_info")
    got = si.get("attention_backend") if isinstance(si, dict) else None
    return got if isinstance(got, str) else None


@dataclass(frozen=True)
class RunSummary:
    """One arm's run as the report shows it: what was asked of the server and what it reported."""

    manifest: RunManifest

    def to_json(self) -> dict[str, Any]:
        m = self.manifest
        si = m.server_info.get("server_info") or {}
        return {"run_id": m.run_id, "target": m.target, "model": m.model, "kv_cache_dtype": m.kv_cache_dtype,
                "reported_kv_dtype": m.server_info.get("kv_cache_dtype"), "kv_scale": si.get("kv_scale"),
                "kv_fault": si.get("kv_fault"), "engine": m.server_info.get("engine"),
                "attention_backend": attention_backend(m),
                "kv_capacity_tokens": m.server_info.get("kv_capacity_tokens"),
                "token_ids": bool(m.params.token_ids),
                "base_urls": list(m.base_urls), "units": m.counts.get("units"), "ok": m.counts.get("ok"),
                "failed": m.counts.get("failed"), "started_at": m.started_at, "finished_at": m.finished_at,
                "fraction": m.fraction, "concurrency": m.concurrency,
                "suites": [{"name": s.name, "sha256": s.sha256, "n_items": s.n_items} for s in m.suites]}


@dataclass(frozen=True)
class Judgement:
    """The judge's answer: the gate's verdict whole, the looks it replayed, and the report's other
    sections (`head`: what precedes the verdict in report.json; `body`: what follows the runs)."""

    verdict: Verdict
    plan: LookPlan
    sizes: tuple[int, ...]  # the looks judged: the plan's, cut to the items both arms reached
    nominal_alpha: float
    runs: Mapping[str, RunSummary | None]
    head: Mapping[str, Any] = field(default_factory=dict)
    body: Mapping[str, Any] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code

    @property
    def decided(self) -> bool:
        return self.verdict.verdict != "INCONCLUSIVE"

    @property
    def on_margin(self) -> bool:
        """Stopped INCONCLUSIVE by the futility rule: the candidate sits on its margin (gate/futility.py)."""
        return bool(self.verdict.on_margin)

    @property
    def stop(self) -> str:
        m = self.verdict.on_margin
        if m and m["final_items"] > m["items"]:
            return (f"stopped on its margin at look {m['look']} of {len(self.plan.planned)} ({m['items']} of "
                    f"{self.plan.pool} items): the plan's last look would decide with probability {m['power']:.2f}")
        return self.plan.stop_reason(self.verdict.verdict, len(self.verdict.looks), list(self.sizes))

    def verdict_json(self) -> dict[str, Any]:
        """report.json's "verdict": the gate's own form, with the look plan it was judged on."""
        vjson = self.verdict.to_json()
        policy, plan, stop = self.verdict.policy, self.plan, self.stop
        sequential = {**vjson.get("sequential", {}), "planned_looks": len(plan.planned),
                      "max_looks": policy.looks, "first_look": policy.first_look, "planned": list(plan.planned),
                      "next_look": plan.next_look, "pool": plan.pool, "sizes": list(plan.sizes),
                      "nominal_alpha": self.nominal_alpha, "stop": stop, "overlap": plan.overlap,
                      "budget": plan.budget if plan.stop else None, "earlier": list(plan.earlier)}
        reason = vjson["reason"] + (f"; {stop}" if not self.decided else "")
        return {**vjson, "reason": reason, "sequential": sequential}

    def to_json(self) -> dict[str, Any]:
        """report.json."""
        from kvqual.gate.origin import bounds_provenance

        return {**self.head, "verdict": self.verdict_json(), "provenance": bounds_provenance(self.verdict.policy),
                "runs": {arm: r.to_json() if r is not None else None for arm, r in self.runs.items()},
                **self.body}
