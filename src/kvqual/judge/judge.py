"""The judge: saved runs → the report dict (report.json), pure over the files. `kvqual report` is
this alone; `kvqual compare` calls it after each round (compare/flow.py). Its imports hold no
transport: it reads the run folders (store.py, tokenstore.py) and the teacher-forcing files
(forced.py), never a server (tests/test_architecture.py checks the closure).
"""

from __future__ import annotations

import gc
import json
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from kvqual import __version__
from kvqual import capacity as kvcap
from kvqual.forced import forcing_cost, load_forced, refusal, teacher_file, through_cache, window_limit_of
from kvqual.judge import metrics as mx
from kvqual.judge import positions as pos
from kvqual.judge import speed as sp
from kvqual.judge.arms import MIN_REPRODUCED, Arm, forcing_from, rounded, usable
from kvqual.judge.record import Judgement, LookPlan, RunSummary, attention_backend
from kvqual.judge.tail import tail_summary
from kvqual.errors import KvqualError
from kvqual.gate import GatePolicy
from kvqual.records import RunManifest, unusable_answer
from kvqual.store import SAMPLES, load_manifest, load_samples

if TYPE_CHECKING:
    from kvqual.load.evidence import LoadEvidence

REPORT_SCHEMA_VERSION = 1


def _keys_in(samples: dict, items: set[tuple[str, str]]) -> dict:
    return {k: v for k, v in samples.items() if (k[0], k[1]) in items}


def judge(base_dir: Path, cand_dir: Path, aa_dir: Path | None, policy: GatePolicy, *, command: str,
          teacher_forcing: bool = True, warnings: list[str] | None = None, allow_mismatch: bool = False,
          seed: int = 0, plan: LookPlan | None = None, speed_from: LoadEvidence | None = None) -> Judgement:
    """`_judge` with the cyclic garbage collector paused: the judge reads every sample and forced
    record into objects (65k at 20k items), whose allocation triggers collections that walk all of
    them again and again (~5% of the judge's CPU at 20k items), and it makes no cycles worth
    collecting; what it leaves is collected as usual once it returns."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return _judge(base_dir, cand_dir, aa_dir, policy, command=command, teacher_forcing=teacher_forcing,
                      warnings=warnings, allow_mismatch=allow_mismatch, seed=seed, plan=plan, speed_from=speed_from)
    finally:
        if paused:
            gc.enable()


def _judge(base_dir: Path, cand_dir: Path, aa_dir: Path | None, policy: GatePolicy, *, command: str,
           teacher_forcing: bool = True, warnings: list[str] | None = None, allow_mismatch: bool = False,
           seed: int = 0, plan: LookPlan | None = None, speed_from: LoadEvidence | None = None) -> Judgement:
    """Saved runs → the judgement (report.json is its `to_json()`). Pure given the files: same runs, same numbers.
    `speed_from`: a load.json of the same two targets; the speedup criterion is judged on it, the
    same evidence at every look, and report.json gets its `steady_speed`.

    The gate replays the looks of a sequential compare: at look k it judges the first sizes[k]
    items of the seeded item order (plan.item_order), as the compare did after each round.
    `plan` comes from the compare; without it the looks are the geometric schedule (`look_sizes`)
    over the items the candidate answered."""
    from kvqual.gate import decide_sequence
    from kvqual.plan import item_order

    bm, cm = load_manifest(base_dir), load_manifest(cand_dir)
    if speed_from is not None:
        speed_from.check_served(bm, cm)
    am = load_manifest(aa_dir) if aa_dir else None
    base_s, cand_s = load_samples(base_dir, "inline"), load_samples(cand_dir, "inline")
    aa_s = load_samples(aa_dir, "inline") if aa_dir else None
    forced_b = load_forced(teacher_file(base_dir, bm.run_id), logprobs=False) if teacher_forcing else {}
    forced_b2 = load_forced(teacher_file(base_dir, bm.run_id, True), logprobs=False) if teacher_forcing else {}
    forced_c = load_forced(teacher_file(base_dir, cm.run_id), logprobs=False) if teacher_forcing else {}
    refused = {arm: r for arm, r in (("baseline", refusal(base_dir, bm.run_id)),
                                     ("candidate", refusal(base_dir, cm.run_id))) if r is not None}
    if teacher_forcing and refused:
        forced_b, forced_b2, forced_c = (forced_b, forced_b2, {}) if "baseline" not in refused else ({}, {}, {})
    tf_note = None
    if teacher_forcing and refused:
        tf_note = "; ".join(f"teacher forcing refused on the {arm} ({r['target']}): echo differs from its own "
                            f"generation by {r['mean_abs_nats']} nats; observed: {r['cause']}"
                            for arm, r in refused.items())
    elif teacher_forcing and not (forced_b and forced_c):
        tf_note = "teacher forcing was requested but no teacher-forced files exist for these runs"
    elif not teacher_forcing:
        tf_note = "--no-teacher-forcing: token-level criteria were not evaluated"
    order = item_order(((k[0], k[1]) for k in base_s), bm.params.seed)
    answered = {(k[0], k[1]) for k in cand_s}
    if plan is None:
        plan = LookPlan.geometric(len(answered & set(order)), policy)
    prefix = next((i for i, k in enumerate(order) if k not in answered), len(order))  # items both arms reached
    sizes = [n for n in plan.sizes if n <= prefix] or [prefix]
    judged = set(order[: sizes[-1]])
    base_s, aa_s = _keys_in(base_s, judged), (_keys_in(aa_s, judged) if aa_s is not None else None)
    arm_b = Arm(base_s, forcing_from(teacher_file(base_dir, bm.run_id), forced_b),
                   pos.load(base_dir / SAMPLES, base_s, top_k=False),
                   lambda: pos.load(base_dir / SAMPLES, base_s))  # top-k: read only for the cache probe
    arm_c = Arm(cand_s, forcing_from(teacher_file(base_dir, cm.run_id), forced_c),
                   pos.load(cand_dir / SAMPLES, cand_s, top_k=False),
                   lambda: pos.load(cand_dir / SAMPLES, cand_s))
    arm_a = Arm(aa_s, tokens=pos.load(aa_dir / SAMPLES, aa_s, top_k=False)) if aa_dir and aa_s is not None else None
    again = forcing_from(teacher_file(base_dir, bm.run_id, True), forced_b2) if forced_b2 else None
    blind = blind_scoring(bm, cm, arm_b, arm_c, cand_s) if teacher_forcing and forced_c and not refused else None
    if blind:
        tf_note = blind
    # SGLang: scored through the KV cache, a step of tokens a request; and the tokens whose prefix was
    # recomputed instead (forcing/sglang.py); None where neither server was scored so
    cache = _through_cache(base_dir, bm, cm) if teacher_forcing else None
    loops = (mx.loop_flags(base_s), mx.loop_flags(cand_s), mx.loop_flags(aa_s) if aa_s is not None else {})
    diversity = mx.diversities(arm_b, arm_c, arm_a)
    rank = {item: i for i, item in enumerate(order)}  # the units are bet on in this order (gate/tokens.py)
    built = mx.build(arm_b, arm_c, arm_a, again, teacher_forcing, loops, diversity, rank)
    sections, inputs, plots, evidence = built.sections, built.inputs, built.plots, built.evidence
    if teacher_forcing and (refused or blind):
        inputs = _refused_coverage(inputs, tf_note or "")
    tb, tc = sp.throughput_pairs(base_s, cand_s)
    steady = speed_from.steady_speed() if speed_from is not None else None  # the same at every look
    looks = []
    for n in sizes:
        items_n = set(order[:n])
        keys = sorted(k for k in base_s if (k[0], k[1]) in items_n)
        look = inputs if n == sizes[-1] else mx.gate_inputs(arm_b, arm_c, arm_a, again, keys, teacher_forcing, loops,
                                                             evidence, diversity, rank)
        if teacher_forcing and (refused or blind) and n != sizes[-1]:
            look = _refused_coverage(look, tf_note or "")
        if steady is not None:
            look = replace(look, steady_speed=steady)
        elif policy.min_speedup is not None and tb.size >= 2:
            look = replace(look, base_throughput=tb, cand_throughput=tc)
        looks.append((n, look))
    verdict = decide_sequence(policy, looks, seed, planned=list(plan.planned))
    speed = None
    sb = sp.speed(base_s, bm.concurrency, bm.server_metrics)
    sc = sp.speed(cand_s, cm.concurrency, cm.server_metrics)
    if sb and sc:
        ratio = {"estimate": None, "ci_low": None, "ci_high": None}
        if tb.size >= 2 and tb.sum() > 0:
            from kvqual import stats as st

            r, _ = st.ratio_of_means_ci(tb, tc)
            ratio = {"estimate": rounded(r.estimate), "ci_low": rounded(r.low), "ci_high": rounded(r.high)}
        overlap = plan.overlap
        if overlap:  # kvqual's own A/A and teacher-forcing requests filled the servers: a queue of its making
            notes = ["indicative only: the A/A replicate and teacher forcing shared the servers with the answers "
                     + ("(set [gate] min_speedup for a like-for-like ratio; docs/speed.md)" if speed_from is None else
                        f"(speedup is judged on the steady-state ratio of {speed_from.path}; docs/speed.md)")]
            sb, sc = {**sb, "queued": None}, {**sc, "queued": None}
        else:
            notes = [f"{arm}: {q}" for arm, q in (("baseline", sb.get("queued")), ("candidate", sc.get("queued"))) if q]
            if notes:
                notes.append("speed figures not comparable: lower --concurrency to what the servers run at once")
        # one arm's answers reused whole from a run before this compare, the other's sent now: two moments
        # (and whatever else the machine ran at each), not one ratio
        apart = None
        if ("baseline" in plan.earlier) != ("candidate" in plan.earlier):
            apart = rounded(abs((cm.started_at or 0) - (bm.started_at or 0)), 0)
            reused = "baseline" if "baseline" in plan.earlier else "candidate"
            when = f"{apart:.0f} s" if apart < 90 else f"{apart / 60:.0f} min"
            notes.insert(0, f"not compared: the {reused}'s answers were reused from a run {when} before the "
                            "other arm's, under whatever else ran then")
        comparable = apart is None and not (overlap or sb.get("queued") or sc.get("queued"))
        # a ratio measured while kvqual's own requests shared the servers is biased against the candidate
        # (an A/A of one config read 0.60× on CPU, 0.46× on an H200): never news, only indicative
        slower = (slower_flag(ratio, policy.min_speedup) if comparable else None) if speed_from is None else \
            slower_flag(speed_from.ratio_for_flag(), policy.min_speedup, steady=speed_from.path)
        speed = {"baseline": sb, "candidate": sc, "ratio": ratio, "comparable": comparable, "apart_s": apart,
                 "note": "; ".join(notes) or None, "slower": slower}
    cov = inputs.coverage
    tail = None
    if teacher_forcing and evidence is not None and not (refused or blind):
        judged_keys = sorted(k for k in base_s if (k[0], k[1]) in judged)
        lost = {k: cand_s[k].error or "" for k in mx.unusable_candidates(arm_b, arm_c, judged_keys)}
        lost.update({k: f.reason or "" for k, f in forced_c.items() if k in base_s and (k[0], k[1]) in judged
                     and k not in evidence.ab_means and unusable_answer(f.reason)})
        tail = tail_summary(evidence.ab_means, evidence.aa_means, judged_keys, base_s, cand_s, lost, policy.broken_kl)
    unfit = {k: v for k, v in mx.does_not_fit(arm_b, arm_c, arm_a).items() if k in judged}
    methods = Counter(f.method for k, f in forced_c.items() if f.method and (k[0], k[1]) in judged)
    return Judgement(
        verdict, plan, tuple(sizes), rounded(verdict.criteria[0].level or policy.alpha, 6),
        {"baseline": RunSummary(bm), "candidate": RunSummary(cm), "aa": RunSummary(am) if am is not None else None},
        head={"schema_version": REPORT_SCHEMA_VERSION, "kvqual_version": __version__,
              "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(max(bm.finished_at or 0, cm.finished_at or 0))),
              "command": command},
        body={
            "teacher_forcing": {
                "enabled": bool(teacher_forcing and forced_b and forced_c), "requested": teacher_forcing, "note": tf_note,
                "pairs": cov.pairs if cov else 0, "usable": cov.usable if cov else 0,
                "left_out": dict(cov.reasons.most_common()) if cov else {},
                "floor": inputs.tokens.floor_note if inputs.tokens is not None else None,
                "refused": refused or None,
                "blind": blind,  # the candidate's scoring never read its KV cache (`blind_scoring`)
                # how the candidate's forced pairs were scored: exact token ids, or text alignment (the fallback)
                "methods": {"ids": methods.get("ids", 0), "text": methods.get("text", 0)},
                # candidate pairs whose completion was longer than the server admits, scored in windows
                "chunked": sum(1 for k, f in forced_c.items() if f.chunks and (k[0], k[1]) in judged),
                "window_limit": _window_limits(base_dir, bm, cm) if teacher_forcing else None,
                # what forcing cost on each server, every round together (retries and reconnects are the faults')
                "cost": ({"baseline": forcing_cost(base_dir, bm.run_id), "candidate": forcing_cost(base_dir, cm.run_id)}
                         if teacher_forcing else None),
                "through_cache": cache},
            "capacity": capacity(bm, cm),
            # prompts a server refused as longer than its context: left out of both arms, neither answer nor failure
            "does_not_fit": ({"items": len(unfit), "limit": min((v for v in unfit.values() if v), default=None),
                              "ids": [f"{suite}/{i}" for suite, i in sorted(unfit)[:20]]} if unfit else None),
            "allow_mismatch": allow_mismatch,
            "warnings": (list(warnings or []) + ([tf_note] if (refused or blind) and tf_note else [])
                         + ([evicted] if (evicted := evicted_scoring(bm, cm, cache)) else [])
                         + ([stepped] if (stepped := stepped_scoring(bm, cm, cache)) else [])),
            "suites": sections, "tail": tail, "speed": speed, "plots": plots, "examples": built.examples,
            **({"steady_speed": speed_from.to_json()} if speed_from is not None else {})})


def _through_cache(base_dir: Path, bm: RunManifest, cm: RunManifest) -> dict[str, Any] | None:
    b, c = through_cache(base_dir, bm.run_id), through_cache(base_dir, cm.run_id)
    return {"baseline": b, "candidate": c} if b or c else None


def _window_limits(base_dir: Path, bm: RunManifest, cm: RunManifest) -> dict[str, int | None] | None:
    """The prompt limit each scoring server's windows were planned against; None when the runs
    record none (forced before kvqual recorded it)."""
    (b_known, b), (c_known, c) = window_limit_of(base_dir, bm.run_id), window_limit_of(base_dir, cm.run_id)
    return {"baseline": b, "candidate": c} if b_known or c_known else None


def capacity(base: RunManifest, cand: RunManifest) -> dict[str, Any] | None:
    """Each arm's KV capacity in tokens as its server reports it (SGLang / kvqual serve
    `max_total_num_tokens`, vLLM `kv_cache_size_tokens`), candidate / baseline, and that ratio split
    into the KV dtype's share and the memory budgets' (`kvqual.capacity`); None when neither
    reports it."""
    return kvcap.split(base.server_info.get("kv_capacity_tokens"), kvcap.kv_dtype(_kv_dtype(base), base.server_info),
                       cand.server_info.get("kv_capacity_tokens"), kvcap.kv_dtype(_kv_dtype(cand), cand.server_info),
                       kvcap.kv_memory_gib(base.server_info), kvcap.kv_memory_gib(cand.server_info))


def saved_plan(out_dir: Path, policy: GatePolicy) -> LookPlan | None:
    """The look plan of the compare that wrote `out_dir/report.json`, so `kvqual report` replays
    the same looks; None (derive it) when there is none or the planned looks differ."""
    try:
        seq = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))["verdict"].get("sequential") or {}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return LookPlan.from_report(seq, policy)


def _kv_dtype(m: RunManifest) -> str | None:
    return (m.kv_cache_dtype or m.server_info.get("kv_cache_dtype") or None)


MISSED_WARN = 0.01  # share of a candidate's tokens scored off the cache above which the report says so
# SGLang attention backends whose prefill stores the new tokens' K/V first and attends to them from the cache, so
# that recomputed and in-step K/V are read back in the cache's dtype too. Measured: FA3 on SGLang 0.5.17 (H100,
# fp8_e4m3 against bf16 on 50 tokens: 0.103 nats/token in one prefill and stepped alike; docs/gpu.md). Triton's
# does not (one prefill bit-identical to bf16); other backends are not measured and keep the warnings.
PREFILL_READS_CACHE = frozenset({"fa3"})


def _other_dtype_through_cache(bm: RunManifest, cm: RunManifest,
                               cache: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The candidate's through-the-cache counts (report.json's teacher_forcing.through_cache) where its KV
    dtype differs from the baseline's and its attention may compute K/V it does not read back from the cache
    (not PREFILL_READS_CACHE), the only case in which how it read its cache decides what the token criteria
    saw; None otherwise."""
    b, c = _kv_dtype(bm), _kv_dtype(cm)
    if not (b and c) or b.lower() == c.lower() or not cache or attention_backend(cm) in PREFILL_READS_CACHE:
        return None
    return cache["candidate"]


def evicted_scoring(bm: RunManifest, cm: RunManifest, cache: Mapping[str, Any] | None) -> str | None:
    """Why part of a candidate's through-the-cache scores (SGLang, forcing/sglang.py) did not read its
    cache, or None: a step whose prefix was evicted was scored against recomputed K/V, which never
    reads a KV dtype, so where the candidate's dtype differs the token criteria understate its effect
    on that share of the tokens (measured: 10-14% of a bf16 server's steps at look 3 with 32,000
    tokens of KV and 32 items at once; docs/gpu.md)."""
    got = _other_dtype_through_cache(bm, cm, cache)
    if not got or not got["scored"]:
        return None
    c = _kv_dtype(cm)
    share = got["missed"] / got["scored"]
    if share < MISSED_WARN:
        return None
    return (f"teacher forcing on {cm.target}: {got['missed']:,} of {got['scored']:,} tokens ({share:.1%}) found their "
            f"prefix evicted from the radix cache and were scored against recomputed K/V, which never reads the "
            f"{c} cache: the token criteria understate its effect on that share (more KV memory for the server, or "
            "a lower [run] concurrency, keeps the prefixes cached; docs/engines.md)")


def stepped_scoring(bm: RunManifest, cm: RunManifest, cache: Mapping[str, Any] | None) -> str | None:
    """Why a candidate scored through the cache more than one token a request understates its KV dtype,
    or None. In a step of S tokens only the first reads all earlier K/V from the cache; the others also
    attend to the K/V the same request has just computed, which never went through the cache's dtype
    (SGLang's extend attention takes the fresh K/V of the extended tokens). Measured on an H100, SGLang
    0.5.17, fp8_e4m3 against bf16: mean KL 0.0048 nats/token at step 8 (1,038 items) against 0.0065 and
    0.0070 at step 1 (511 and 252 items); docs/gpu.md."""
    got = _other_dtype_through_cache(bm, cm, cache)
    if not got or got.get("step", 0) <= 1:
        return None
    c = _kv_dtype(cm)
    return (f"teacher forcing on {cm.target} scored {got['step']} tokens a request (sglang_score_step): within a "
            f"step the tokens also attend to K/V just computed, not read back from the {c} cache, so the token "
            "criteria understate its effect (measured on SGLang: mean KL about a quarter lower at step 8 than at "
            "the default 1; docs/gpu.md)")


def blind_scoring(bm: RunManifest, cm: RunManifest, base: Arm, cand: Arm, cand_s: Mapping) -> str | None:
    """Why the candidate's teacher-forced scores cannot measure its KV cache, or None.

    A candidate configured with another KV dtype whose scores of the baseline's completions are
    bit-identical to the baseline's own on every item (at least MIN_REPRODUCED), while some of its
    generations differ, scored them without reading K/V back from its cache: SGLang scoring a
    sequence in one prefill (`sglang_score_step = 0`) with its triton backend, whose attention uses the
    K/V it has just computed, not what the fp8 cache stores (measured: SGLang 0.5.17, fp8_e4m3, H100;
    FA3's prefill reads them back from the cache, so it is not blind there), or in steps
    on a server that keeps no prefix in its radix cache. Its token criteria would read 0 and
    PASS a cache they never looked at; they are left out instead."""
    b, c = _kv_dtype(bm), _kv_dtype(cm)
    if not (b and c) or b.lower() == c.lower():
        return None
    keys = [k for k in cand.forced.records if k in base.forced.records and usable(base.forced, k) and usable(cand.forced, k)]
    if len(keys) < MIN_REPRODUCED or not pos.all_reproduced(base.forced.arrays, cand.forced.arrays, keys):
        return None
    base_s = base.samples
    pairs = [(base_s[k], s) for k, s in cand_s.items() if k in base_s and s.ok and base_s[k].ok]
    differ = sum(1 for a, s in pairs if a.text != s.text)
    if not differ:
        return None  # the same generations too: nothing says the cache was not read
    # what was observed; an engine's reason only where the server said which engine it is
    why = ("; SGLang with `sglang_score_step = 0` scores a sequence in one prefill without reading K/V back, and "
           "stepped scoring does too where the server keeps no prefix in its cache"
           if cm.server_info.get("engine") == "sglang" else "")
    return (f"teacher forcing shows no effect of {cm.target}'s KV cache: its scores of the baseline's completions "
            f"are bit-identical to the baseline's on all {len(keys)} items though its KV dtype ({c}) is not the "
            f"baseline's ({b}) and {differ} of its {len(pairs)} generations differ, so its scoring did not read "
            f"the cache it generates with{why}; the token criteria are left out (docs/engines.md)")


def _refused_coverage(inputs: Any, why: str) -> Any:
    """Gate inputs with the token criteria refused: every pair left out, for the recorded reason."""
    from kvqual.gate import TokenCoverage

    n = inputs.coverage.pairs if inputs.coverage is not None else 0
    return replace(inputs, tokens=None, unusable=None, coverage=TokenCoverage(True, n, 0, Counter({why: n})))


def slower_flag(ratio: Mapping[str, Any], min_speedup: float | None, steady: str | None = None) -> str | None:
    """One sentence when the candidate is shown slower than the baseline (the ratio's whole
    interval below 1), shown next to the verdict: speed counts in the verdict only with
    `min_speedup`, but a faster config that is slower is news either way. Only for a like-for-like
    ratio: `steady`, a load.json's steady-state one (`--speed-from`), or a compare whose rounds did
    not share the servers. """
    high = ratio.get("ci_high")
    if high is None or high >= 1:
        return None
    what = "per-request output tok/s" if steady is None else "steady-state output tok/s at saturation"
    return (f"the candidate is slower: {ratio['estimate']:.2f}× the baseline's {what} "
            f"[{ratio['ci_low']:.2f}, {high:.2f}]" + ("" if steady is None else f" ({steady})")
            + ("; speed is not gated (set [gate] min_speedup to gate it)" if min_speedup is None
               else f"; gated by min_speedup {min_speedup:g}"))


def find_aa(base_dir: Path) -> Path | None:
    """The A/A replicate saved beside a baseline run, if any."""
    # a run killed between taking its folder's lock and writing its manifest leaves a folder with
    # only `.lock` in it: not a replicate
    candidates = sorted(p for p in base_dir.parent.glob(f"{base_dir.name}-aa1*") if (p / "manifest.json").is_file())
    return candidates[0] if candidates else None


def runs_of_compare(folder: str, aa: str | None) -> tuple[str, str, str | None]:
    """The run folders a compare folder's report.json names (they sit beside it, in the results
    folder), for `kvqual report <compare folder>`; `aa` given wins over the recorded replicate."""
    path = Path(folder)
    try:
        runs = json.loads((path / "report.json").read_text(encoding="utf-8"))["runs"]
        ids = [runs[arm]["run_id"] if runs.get(arm) else None for arm in ("baseline", "candidate", "aa")]
    except FileNotFoundError:
        raise KvqualError(f"{path}: neither a compare folder (no report.json) nor, alone, enough: give the "
                          "compare's folder, or the baseline's and the candidate's run folders") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KvqualError(f"{path / 'report.json'}: unreadable ({exc.__class__.__name__}: {exc})") from None
    if not (ids[0] and ids[1]):
        raise KvqualError(f"{path / 'report.json'}: names no baseline and candidate runs")
    return (str(path.parent / ids[0]), str(path.parent / ids[1]),
            aa if aa else str(path.parent / ids[2]) if ids[2] else None)


def load_report_inputs(run_a: str, run_b: str, aa: str | None) -> tuple[Path, Path, Path | None]:
    a, b = Path(run_a), Path(run_b)
    for p in (a, b):
        if not (p / "manifest.json").is_file():
            raise KvqualError(f"{p}: not a kvqual run folder (no manifest.json)")
    aa_dir = Path(aa) if aa else find_aa(a)
    if aa_dir is not None and not (aa_dir / "manifest.json").is_file():
        raise KvqualError(f"{aa_dir}: not a kvqual run folder (no manifest.json)")
    return a, b, aa_dir


