"""A load.json as the compare's speed evidence (`kvqual compare --speed-from PATH`, docs/speed.md).

`read` takes a load.json (or the folder holding it) and refuses, naming the file, one that is
missing, unreadable, not a load.json, without a ratio, or from a load that failed. The compare
then checks that it measured its own two targets, in its order: `check_targets` against the
config before any request (names, and the targets' identity that load.json records: base URLs,
model, launch, KV dtype), `check_served` against what the servers said in the compare's runs
(model, configured and reported KV dtype, engine, base URLs of targets kvqual does not launch).
`steady_speed` is the gate's input (each arm's steady-state batch means) and `to_json` report.json's
`steady_speed` section. Every problem is a `LoadFileError` (exit 2).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from kvqual.errors import LoadFileError
from kvqual.gate.inputs import SteadySpeed
from kvqual.load import stats
from kvqual.records import public_url

LOAD_JSON = "load.json"
RATIO_TOLERANCE = 1e-3  # relative: the ratio recomputed from the stored batch means (2 decimals) vs load.json's


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class LoadEvidence:
    """A validated load.json of two targets: where it is and what it holds."""

    path: str
    doc: Mapping[str, Any]

    @property
    def arms(self) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        return self.doc["arms"][0], self.doc["arms"][1]

    @property
    def names(self) -> tuple[str, str]:
        return self.arms[0]["target"], self.arms[1]["target"]

    def batches(self, i: int) -> np.ndarray:
        """An arm's steady-state output tok/s batch means, as load.json's ratio took them (its one
        estimate when the window held fewer than two batches)."""
        arm = self.arms[i]
        tok = arm["output_tok_s"]
        return np.asarray(tok["batches"] if arm["window"]["batches"] >= 2 else [tok["estimate"]], dtype=float)

    def source(self) -> str:
        """Where the evidence comes from, in the criterion's detail."""
        windows = []
        for arm in self.arms:
            w = arm["window"]
            windows.append(f"{arm['target']} {w['start_s']:g}–{w['end_s']:g} s in {w['batches']} batches")
        return (f"from {self.path} (kvqual load at concurrency {self.arms[0]['concurrency']}; steady windows "
                + ", ".join(windows) + ")")

    def steady_speed(self) -> SteadySpeed:
        return SteadySpeed(self.batches(0), self.batches(1), self.source())

    def to_json(self) -> dict[str, Any]:
        """report.json `steady_speed`: the file, what it measured, and its own ratio (at its level)."""
        ratio = self.doc["ratio"]
        return {
            "source": self.path, "baseline": self.names[0], "candidate": self.names[1],
            "concurrency": self.arms[0]["concurrency"], "started_at": self.doc.get("started_at"),
            "arms": {role: {"target": arm["target"], "output_tok_s": arm["output_tok_s"]["estimate"],
                            "window": {k: arm["window"].get(k) for k in ("start_s", "end_s", "batches", "batch_s")},
                            "running_mean": (arm.get("server") or {}).get("running_mean"),
                            "saturated": arm.get("saturated")}
                     for role, arm in zip(("baseline", "candidate"), self.arms)},
            "ratio": {k: ratio.get(k) for k in ("estimate", "low", "high", "level", "df", "method")},
        }

    def ratio_for_flag(self) -> dict[str, Any]:
        """load.json's ratio (at its level, 95 %) in the keys `judge.judge.slower_flag` reads."""
        r = self.doc["ratio"]
        return {"estimate": r.get("estimate"), "ci_low": r.get("low"), "ci_high": r.get("high")}

    def _mismatch(self, problem: str) -> LoadFileError:
        return LoadFileError(self.path, problem + " (--speed-from needs a `kvqual load BASELINE CANDIDATE` of this "
                                                  "compare's two targets)")

    def check_targets(self, baseline: Any, candidate: Any) -> None:
        """The load measured these two config targets (`config.Target`), baseline first: same names,
        and the same identity where load.json records one (else, for targets kvqual does not launch,
        the same base URLs, and the same configured model and KV dtype)."""
        names, want = self.names, (baseline.name, candidate.name)
        if names != want:
            order = ", the other way round" if names == want[::-1] else ""
            raise self._mismatch(f"measured {names[0]} (baseline) vs {names[1]}, this compare is {want[0]} vs "
                                 f"{want[1]}{order}")
        for arm, target in zip(self.arms, (baseline, candidate)):
            recorded = arm.get("identity")
            now = json.loads(json.dumps(target.identity()))
            if recorded is not None:
                if recorded != now:
                    key = next(k for k in sorted(set(recorded) | set(now)) if recorded.get(k) != now.get(k))
                    raise self._mismatch(f"{target.name} was measured with {key} {recorded.get(key)!r}, the config "
                                         f"now says {now.get(key)!r}")
                continue
            checks = [("kv_cache_dtype", (arm.get("kv_cache_dtype") or {}).get("expected"), target.kv_cache_dtype)]
            if target.model is not None:
                checks.append(("model", arm.get("model"), target.model))
            if not target.launch:
                checks.append(("base_urls", [public_url(u) for u in arm.get("base_urls") or []],
                               [public_url(u) for u in target.base_urls]))
            self._compare(target.name, checks, "the config now says")

    def check_served(self, baseline: Any, candidate: Any) -> None:
        """The load measured what the compare's runs (`RunManifest`s) served: same targets, models,
        configured and reported KV dtypes, engines; and base URLs, where load.json's identity says
        kvqual did not launch the target (a launched server gets a new port every time)."""
        for arm, m in zip(self.arms, (baseline, candidate)):
            if arm["target"] != m.target:
                raise self._mismatch(f"measured {self.names[0]} vs {self.names[1]}, the runs are of {baseline.target} "
                                     f"vs {candidate.target}")
            dtype = arm.get("kv_cache_dtype") or {}
            checks = [("model", arm.get("model"), m.model),
                      ("kv_cache_dtype", dtype.get("expected"), m.kv_cache_dtype),
                      ("the reported KV dtype", dtype.get("reported"), m.server_info.get("kv_cache_dtype")),
                      ("engine", arm.get("engine"), m.server_info.get("engine"))]
            identity = arm.get("identity")
            if isinstance(identity, Mapping) and not identity.get("launch") and "builtin" not in identity:
                checks.append(("base_urls", [public_url(u) for u in arm.get("base_urls") or []],
                               [public_url(u) for u in m.base_urls]))
            self._compare(m.target, checks, "this compare's run has", skip_unknown=True)

    def _compare(self, name: str, checks: list[tuple[str, Any, Any]], now: str, skip_unknown: bool = False) -> None:
        for what, recorded, current in checks:
            if skip_unknown and (recorded is None or current is None):
                continue
            if recorded != current:
                raise self._mismatch(f"{name} was measured with {what} {recorded!r}, {now} {current!r}")


def read(path: str | Path) -> LoadEvidence:
    """The load.json at `path` (a file, or the folder `kvqual load` wrote), validated."""
    from kvqual.load.summary import FORMAT_VERSION  # summary imports the load's transport: only when reading

    p = Path(path)
    if p.is_dir():
        p = p / LOAD_JSON
        if not p.is_file():
            raise LoadFileError(str(p.parent), "holds no load.json (--speed-from takes a load.json or its folder)")
    where = str(p)
    if not p.is_file():
        raise LoadFileError(where, "no such file")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LoadFileError(where, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise LoadFileError(where, "cannot read: not UTF-8 text") from None
    except ValueError as exc:
        raise LoadFileError(where, f"not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or "kvqual_load_version" not in doc:
        raise LoadFileError(where, "not a kvqual load.json (no kvqual_load_version)")
    if doc["kvqual_load_version"] != FORMAT_VERSION:
        raise LoadFileError(where, f"kvqual_load_version {doc['kvqual_load_version']!r}: this kvqual reads "
                                   f"{FORMAT_VERSION}")
    if doc.get("status") == "failed":
        raise LoadFileError(where, "the load failed (a target's failed requests were above max_failed_rate): "
                                   "its figures are not evidence")
    if not isinstance(doc.get("ratio"), dict):
        arms = doc.get("arms") if isinstance(doc.get("arms"), list) else []
        raise LoadFileError(where, f"holds no ratio (status {doc.get('status')!r}, {len(arms)} target(s) measured; "
                                   "run `kvqual load BASELINE CANDIDATE`)")
    evidence = LoadEvidence(where, doc)
    problem = _malformed(evidence)
    if problem:
        raise LoadFileError(where, f"not a complete load.json: {problem}")
    return evidence


def _malformed(e: LoadEvidence) -> str | None:
    """What is missing or wrong in a load.json with a ratio (None: nothing)."""
    arms = e.doc.get("arms")
    if not isinstance(arms, list) or len(arms) != 2 or not all(isinstance(a, dict) for a in arms):
        return "`arms` is not a list of two targets"
    for i, arm in enumerate(arms):
        tok, window = arm.get("output_tok_s"), arm.get("window")
        if not isinstance(arm.get("target"), str):
            return f"arms[{i}].target is not a name"
        if not isinstance(window, dict) or not isinstance(window.get("batches"), int) or not all(
                _number(window.get(k)) for k in ("start_s", "end_s")):
            return f"arms[{i}].window is not a steady window"
        if not isinstance(arm.get("concurrency"), int):
            return f"arms[{i}].concurrency is not an integer"
        if not isinstance(tok, dict) or not _number(tok.get("estimate")) or not isinstance(tok.get("batches"), list) \
                or not all(_number(x) for x in tok["batches"]) or len(tok["batches"]) != max(window["batches"], 1):
            return f"arms[{i}].output_tok_s has no batch means"
    ratio = e.doc["ratio"]
    if (ratio.get("baseline"), ratio.get("candidate")) != e.names:
        return "ratio.baseline / ratio.candidate are not the two arms"
    if not _number(ratio.get("estimate")):
        return "ratio.estimate is not a number (the baseline measured no throughput)"
    again = stats.fieller_ratio_ci(e.batches(0), e.batches(1)).estimate
    if not math.isclose(again, ratio["estimate"], rel_tol=RATIO_TOLERANCE):
        return f"ratio.estimate {ratio['estimate']} is not the arms' batch means' ratio {again:.4g}"
    return None
