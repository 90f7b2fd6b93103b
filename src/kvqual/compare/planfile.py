"""A compare's plan, recorded beside its answers, so stored answers are never judged under another.

The plan is what the gate's error rates were designed for: the pool (items judged at most), the
planned look sizes, α and the look schedule (`[gate] looks`, `first_look`). Judging the same stored
answers again under a larger pool or more looks (a larger `--max-items`, `--looks` after the fact)
is choosing the plan after seeing the data: a false PASS of 0.077 instead of 0.05 at the accuracy
margin for 124 → 2,108 items (issue 51). So the first judgement writes `plan.json` into the compare
folder, and a later command whose plan differs is refused in one line (exit 2): start a new compare
(another `--seed`). A budget (`--max-minutes`, `--budget-tokens`) is not part of the plan: a compare
a budget stopped continues on the same plan. `--rerun` asks the servers again: new answers, new plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from kvqual.errors import UsageError
from kvqual.store import write_json_atomic

PLAN = "plan.json"


def plan_of(pool: int, planned: tuple[int, ...] | list[int], policy: Any) -> dict[str, Any]:
    """The plan's identity: what may not change between judgements of the same answers."""
    return {"pool": int(pool), "planned": [int(n) for n in planned], "alpha": policy.alpha,
            "looks": policy.looks, "first_look": policy.first_look}


def _words(p: Mapping[str, Any]) -> str:
    return f"pool {p.get('pool')}, looks at {p.get('planned')}, α {p.get('alpha')}"


def recorded(folder: Path) -> dict[str, Any] | None:
    """The plan recorded in a compare folder, or None (no judgement yet, or a compare from before plans)."""
    try:
        data = json.loads((folder / PLAN).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_or_record(folder: Path, plan: Mapping[str, Any], *, fresh: bool = False) -> None:
    """Record `plan` for the answers judged in `folder`, or refuse a plan other than the recorded one.
    `fresh`: the answers are new (`--rerun`): the plan is recorded anew."""
    old = None if fresh else recorded(folder)
    if old is None:
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(folder / PLAN, dict(plan))
        return
    if {k: old.get(k) for k in plan} != dict(plan):
        raise UsageError(f"{folder / PLAN}: these answers were judged under {_words(old)}; judging them under "
                         f"{_words(plan)} would re-judge stored answers under another plan: start a new compare "
                         "(another --seed), or keep the recorded plan")


def check_report(folder: Path, policy: Any) -> None:
    """`kvqual report`: refuse a `[gate]` look schedule or α other than the recorded plan's."""
    old = recorded(folder)
    if old is None:
        return
    now = {"alpha": policy.alpha, "looks": policy.looks, "first_look": policy.first_look}
    if {k: old.get(k) for k in now} != now:
        raise UsageError(f"{folder / PLAN}: these answers were judged under {_words(old)} (looks {old.get('looks')}, "
                         f"first look {old.get('first_look')}); judging them with looks {policy.looks}, first look "
                         f"{policy.first_look}, α {policy.alpha} would re-judge stored answers under another plan: "
                         "start a new compare (another --seed)")
