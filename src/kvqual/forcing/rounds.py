"""Teacher forcing of a compare's rounds: `teacher_force` runs the passes of one round
(`teacher.py`: vLLM shapes and kvqual serve; `sglang.py`: SGLang's /generate) and leaves its
files beside the baseline's run (their names, writer and reader: `kvqual.forced`).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Callable

from kvqual.config import RunDefaults, Target
from kvqual.errors import EchoDisagreement, InfrastructureError
from kvqual.liveness import Liveness
from kvqual.gate.criteria import failures_shown_above
from kvqual.records import unusable_answer
from kvqual.forced import CACHE_KEYS, COST_KEYS, FAILED, forcing_cost, through_cache, refusal, refusal_file, teacher_file, window_file
from kvqual.forcing.sglang import SglangForcer
from kvqual.forcing.teacher import TeacherForcer, check_echo_trust, force_all, trust_sample
from kvqual.news import say
from kvqual.probe import PROBE_TIMEOUT_S
from kvqual.records import Item, RunManifest
from kvqual.store import load_samples, write_json_atomic


def make_forcer(info: dict, base_url: str, api_key: str, model: str, top_k: int, run: RunDefaults) -> TeacherForcer:
    """The forcer for a server as its probe describes it (`server_info`): SGLang's native scoring, through
    the cache in `[run] sglang_score_step` steps, or the OpenAI echo (vLLM, kvqual serve)."""
    if info.get("engine") == "sglang":
        return SglangForcer(base_url, api_key, model, top_k, run.timeout, run.concurrency, run.retries,
                            step=run.sglang_score_step)
    return TeacherForcer(base_url, api_key, model, top_k, run.timeout, run.concurrency, run.retries)


def _rescore(base_dir: Path, run_id: str, step: int, name: str) -> dict[str, int]:
    """Drop this server's stored scores of an earlier round when they were taken another way than `step`
    says (an SGLang server scored in one prefill, as kvqual did before it scored through the cache, or with
    another `sglang_score_step`): one comparison never mixes scores that read the cache with scores that
    did not. The earlier rounds' through-the-cache counts that stand (none where the step changed)."""
    stored = through_cache(base_dir, run_id)
    was = stored["step"] if stored else 0
    if was == step:
        return {k: stored[k] for k in CACHE_KEYS} if stored else dict.fromkeys(CACHE_KEYS, 0)
    files = [f for f in (teacher_file(base_dir, run_id), teacher_file(base_dir, run_id, True)) if f.exists()]
    for f in files:
        f.unlink()
    if files:
        say(f"{name}: its stored teacher-forced scores were taken with sglang_score_step {was}; scoring again with {step}")
    return dict.fromkeys(CACHE_KEYS, 0)


async def common_window_limit(*targets: Target, timeout: float = PROBE_TIMEOUT_S) -> int | None:
    """The smallest prompt limit any of these scoring servers reports (`/v1/models` max_model_len,
    less echo's one token); None when none reports one. Given to every forcer of a comparison
    (`limit_to`), it makes both arms score a long completion in the same windows. `timeout`: the
    run's (`probe.probe_timeout`)."""
    limits = []
    for t in targets:
        forcer = TeacherForcer(t.base_url, t.api_key(), t.model or "", 0, timeout, 1)
        try:
            limits.append(await forcer.prompt_limit())
        finally:
            await forcer.aclose()
    known = [n for n in limits if n is not None]
    return min(known) if known else None


async def teacher_force(target: Target, manifest: RunManifest, base_dir: Path, items: dict[tuple[str, str], Item],
                        run: RunDefaults, own_dir: Path, *, keys: set[tuple[str, str]] | None = None,
                        again: bool = False, again_keys: set[tuple[str, str]] | None = None, check: bool = True,
                        limit: int | None = None, top_k: int | None = None,
                        on_done: Callable[[], None] | None = None) -> float | None:
    """Teacher-force the baseline's completions (of the items in `keys`, all when None) on `target`;
    `again` also runs the second pass on the same server (the token-level A/A floor), over the items
    of `again_keys` among them (all when None). `check`:
    first score the server's own outputs, per API kind, and refuse an echo that disagrees.
    `limit`: the prompt tokens a window may hold (`common_window_limit` of the comparison's
    servers; None: the server's own), recorded beside the teacher files.
    `top_k`: the top logprobs a position is scored with (default: the run's, at least 5, what KL reads).
    `on_done` is called per completion forced (either pass)."""
    if refusal(base_dir, manifest.run_id) is not None:
        return None  # this server's echo was refused at an earlier round
    base_samples = [s for s in load_samples(base_dir, "tokens").values() if s.ok and (keys is None or (s.suite, s.id) in keys)]
    forcer = make_forcer(manifest.server_info, target.base_url, target.api_key(), manifest.model or "",
                         top_k or max(run.top_logprobs, 5), run).limit_to(limit)
    before = forcing_cost(base_dir, manifest.run_id) or dict.fromkeys(COST_KEYS, 0)  # earlier rounds' cost
    cached_before = _rescore(base_dir, manifest.run_id, forcer.step, target.name)  # earlier rounds' cache counts

    checked = dict.fromkeys(CACHE_KEYS, 0)  # what the echo check scored: not the baseline's completions

    def record(cost: dict[str, int]) -> None:
        cached = {"step": forcer.step, "scored": cached_before["scored"] + forcer.cache_scored - checked["scored"],
                  "missed": cached_before["missed"] + forcer.cache_missed - checked["missed"]}
        write_json_atomic(window_file(base_dir, manifest.run_id), {"target": target.name, "run_id": manifest.run_id,
                                                                   "max_prompt": limit, "cost": cost,
                                                                   **({"through_cache": cached} if forcer.step else {})})

    record(before)
    probe = any(item.meta and "cache_wave" in item.meta for item in items.values())
    if not isinstance(forcer, SglangForcer) and (target.cold or probe):  # SGLang has no cache_salt
        forcer.salted(f"kvqual-forced:{manifest.run_id}:{'again' if again else 'first'}")
    live = Liveness(f"{target.name}: teacher forcing", [forcer.transport], stall=run.stall_seconds)

    def done_one() -> None:
        live.answered()
        if on_done is not None:
            on_done()

    try:
        trust = None
        if check:
            own = trust_sample(list(load_samples(own_dir, "tokens").values()), items)

            async def score_own() -> list:
                return [await forcer.force(items[(s.suite, s.id)], s) for s in own]

            own_forced = await live.guard(score_own())
            checked.update(scored=forcer.cache_scored, missed=forcer.cache_missed)
            try:
                trust = check_echo_trust(list(zip(own, own_forced)), target.base_url)
            except EchoDisagreement as exc:
                # keep every answer and go on: the generation criteria still judge; the token criteria
                # are refused for this server, with why (never scored on noise, never silently dropped)
                write_json_atomic(refusal_file(base_dir, manifest.run_id), {
                    "target": target.name, "run_id": manifest.run_id, "mean_abs_nats": round(exc.mean_abs, 4),
                    "cause": exc.cause, "message": str(exc)})
                say(f"warning: {exc}; judging {target.name} without teacher-forced metrics")
                return None
        started = time.perf_counter()
        passes = [force_all(forcer, items, base_samples, teacher_file(base_dir, manifest.run_id), done_one)]
        again_samples = [s for s in base_samples if again_keys is None or (s.suite, s.id) in again_keys]
        if again:  # both passes at once: the server batches them together
            passes.append(force_all(forcer, items, again_samples, teacher_file(base_dir, manifest.run_id, True),
                                    done_one))
        for forced in await live.guard(asyncio.gather(*passes)):
            # an answer that is not data is the server's own outcome, which the gate judges (a broken prompt)
            failed = [f for f in forced if (f.reason or "").startswith(FAILED) and not unusable_answer(f.reason)]
            if failures_shown_above(len(failed), len(forced), run.max_failed_rate):
                raise InfrastructureError(
                    f"{target.name}: teacher forcing: {len(failed)} of {len(forced)} requests failed "
                    f"({len(failed) / len(forced):.1%} > max_failed_rate {run.max_failed_rate:.1%}; "
                    f"{failed[0].reason}) — run the same command again to retry them")
        say(f"teacher forcing {len(base_samples)} baseline completions on {target.name}"
             + ((" twice (the second pass is the A/A floor)" if len(again_samples) == len(base_samples) else
                 f", {len(again_samples)} of them twice (the second pass is the A/A floor)") if again else "")
             + f": {time.perf_counter() - started:.0f} s, {forcer.requests} requests{forcer.through_cache_note()}"
             + (f" ({forcer.retried} attempts after a failure, {forcer.reconnects} reconnects)"
                if forcer.retried or forcer.reconnects else ""))
        return trust
    finally:
        spent = {"requests": forcer.requests, "retried": forcer.retried, "reconnects": forcer.reconnects}
        record({k: before[k] + spent[k] for k in COST_KEYS})  # kept whatever ends the pass (report.json says it)
        await forcer.aclose()
