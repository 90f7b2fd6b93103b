"""Run suites against one target: bounded concurrency, retries, progress; writes through store.

The work list is (item, repeat) units in a seeded shuffled order (the same order for every
arm; plan.py), minus the units the run folder already answered. N workers pull from one iterator, so
memory stays constant in the number of answers; each answer is appended to disk at once.

Each request is sent under the one retry policy (`retry.RetryPolicy`): retries after transient
failures, and reconnects, which spend no attempt, after a server closed a kept-alive connection
before responding. The run counts both apart (`RunStats`, the manifest's counts).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from kvqual import __version__
from kvqual.client import (Answer, chat_payload, completion_payload, inter_token_latency, merge_chat_stream,
                           merge_completion_stream, parse_chat, parse_completion)
from kvqual.config import RunDefaults, Target
from kvqual.errors import InfrastructureError, ServerContractError
from kvqual.liveness import Liveness
from kvqual.plan import RunPlan, Unit, cache_waves, plan_units
from kvqual.gate.criteria import failures_shown_above
from kvqual.records import GenerationParams, Item, RunManifest, Sample, unusable_answer
from kvqual.retry import RetryPolicy
from kvqual.store import FLUSH_SECONDS, RunLock, RunStore, answered_keys, failure_summary, last_errors
from kvqual.suites import LoadedSuite
from kvqual.telemetry import Scraper
from kvqual.transport import Transport, close_all


@dataclass
class RunStats:
    total: int
    done: int = 0
    ok: int = 0
    failed: int = 0
    completion_tokens: int = 0
    started: float = 0.0
    retries: int = 0  # attempts after a real failure, this session
    reconnects: int = 0  # requests sent again after the server closed the connection unanswered


async def request_one(transport: Transport, item: Item, repeat: int, params: GenerationParams, model: str,
                      retries: int, rng: random.Random, cache_salt: str | None = None) -> tuple[Sample, int]:
    """One item, retried on transient failures; a final failure is recorded, never answered.
    Returns the sample and how many times it was sent again after a close before any response
    (reconnects: not attempts, and not counted against `retries`). `cache_salt`: sent as vLLM's
    `cache_salt` (a target with `cold = true` gives every request its own: never a cache hit)."""
    if item.api == "chat":
        path, body, parse = "/chat/completions", chat_payload(item, params, model, repeat, cache_salt), parse_chat
    else:
        path, body, parse = ("/completions", completion_payload(item, params, model, repeat, cache_salt),
                             parse_completion)
    chat = item.api == "chat"
    started, t0 = time.time(), time.perf_counter()

    async def attempt() -> tuple[Answer, float | None, float | None]:
        nonlocal started, t0  # what a sample records is its last attempt's start and latency
        started, t0 = time.time(), time.perf_counter()
        ttft = itl = None
        if params.stream:
            chunks, ttft, last = await transport.post_stream(path, body, chat=chat)
            data = merge_chat_stream(chunks) if chat else merge_completion_stream(chunks)
        else:
            data = await transport.post_json(path, body)
        answer: Answer = parse(data, params.top_logprobs, transport.base_url)
        if params.stream:
            n = answer.completion_tokens or (len(answer.logprobs.tokens) if answer.logprobs else None)
            itl = inter_token_latency(ttft, last, n)
        return answer, ttft, itl

    sent = await RetryPolicy(retries).send(attempt, rng)
    if sent.failure is not None:
        return Sample(id=item.id, suite=item.suite, repeat=repeat, text=None, finish_reason=None,
                      completion_tokens=None, error=sent.failure.message, latency_s=time.perf_counter() - t0,
                      started_at=started, attempts=sent.attempts, base_url=transport.base_url,
                      context_id=item.context_id, prompt_hash=item.prompt_hash), sent.reconnects
    answer, ttft, itl = sent.value  # type: ignore[misc] - answered: the value is there
    return Sample(
        id=item.id, suite=item.suite, repeat=repeat, text=answer.text, finish_reason=answer.finish_reason,
        completion_tokens=answer.completion_tokens, error=None, prompt_tokens=answer.prompt_tokens,
        latency_s=time.perf_counter() - t0, started_at=started, attempts=sent.attempts, logprobs=answer.logprobs,
        score=_score(item, answer.text), base_url=transport.base_url, context_id=item.context_id,
        ttft_s=ttft, itl_s=itl, cached_tokens=answer.cached_tokens, prompt_hash=item.prompt_hash,
    ), sent.reconnects


def _score(item: Item, text: str) -> float | None:
    if not item.scored:
        return None
    from kvqual.suites import scorers

    return scorers.score(item, text)


LINE_EVERY_S = 30.0  # a plain progress line at most this often when stderr is not a terminal


class _Progress:
    """A rich progress bar on a terminal; elsewhere (CI logs, pipes) a plain line every 30 s and
    one at the end, so a long run is never silent; nothing when `mode` is "off"."""

    def __init__(self, label: str, stats: RunStats, mode: str) -> None:
        self.label, self.stats, self.mode, self._bar, self._task = label, stats, mode, None, None
        self._last_line = stats.started
        if mode == "bar":
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bar = Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TimeRemainingColumn(),
                                 transient=False, refresh_per_second=4)
            self._task = self._bar.add_task(label, total=stats.total, rate="")
            self._bar.start()

    def _rate(self) -> str:
        s = self.stats
        elapsed = max(time.perf_counter() - s.started, 1e-9)
        return (f"{s.done / elapsed:.1f} req/s  {s.completion_tokens / elapsed:.0f} tok/s  errors {s.failed}"
                + (f"  reconnects {s.reconnects}" if s.reconnects else ""))

    def _line(self) -> None:
        s = self.stats
        print(f"kvqual: {self.label}: {s.done}/{s.total} done  {self._rate()}  "
              f"({time.perf_counter() - s.started:.0f} s)", file=sys.stderr, flush=True)
        self._last_line = time.perf_counter()

    def update(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=self.stats.done, rate=self._rate())
        elif self.mode == "lines" and time.perf_counter() - self._last_line >= LINE_EVERY_S:
            self._line()

    def close(self) -> None:
        if self._bar is not None:
            self.update()
            self._bar.stop()
        elif self.mode == "lines" and self.stats.total:
            self._line()


def progress_enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def progress_mode(progress: bool | None) -> str:
    if progress is False:
        return "off"
    return "bar" if progress or progress_enabled() else "lines"


async def execute(plan: RunPlan, store: RunStore, run: RunDefaults, *, progress: bool | None = None,
                  items_upto: int | None = None, on_done: Callable[[], None] | None = None,
                  judged: bool = False) -> RunManifest:
    """Send every unanswered unit of `plan` (of its first `items_upto` items: one round of a
    sequential compare); returns the manifest (also on disk): status "complete" once every unit of
    the plan is answered, "partial" while later rounds are still to come. `on_done` is called per
    answer stored (a compare's overall progress). Too many failures are an `InfrastructureError`:
    above `max_failed_rate` for a run of its own; for a compare's round (`judged`), failures other
    than answers that are not data, shown above it (the gate judges the rest at every look)."""
    wanted = plan_units(plan.suites, plan.params.repeats, plan.params.seed, plan.fraction, items_upto)
    all_units = len(wanted) if items_upto is None else len(
        plan_units(plan.suites, plan.params.repeats, plan.params.seed, plan.fraction))
    units = [u for u in wanted if (u[0].suite, u[0].id, u[1]) not in store.done]
    total = len(store.done) + len(units)
    stats = RunStats(total=total, done=len(store.done), ok=len(store.done), started=time.perf_counter())
    transports = [Transport(u, plan.target.api_key(), run.timeout) for u in plan.target.base_urls]
    in_flight = [0] * len(transports)
    bar = _Progress(plan.run_id, stats, progress_mode(progress))
    iterator: Iterator[Unit] = iter(units)
    rng = random.Random(plan.params.seed)
    consecutive_conn_failures = 0
    abort: list[BaseException] = []
    live = Liveness(plan.target.name, transports, stall=run.stall_seconds)  # a hung server: exit 4 in minutes
    run_id = plan.run_id  # a hash of the plan's identity: once, not once a request

    async def worker() -> None:
        nonlocal consecutive_conn_failures
        for item, repeat in iterator:
            if abort:
                return
            slot = min(range(len(transports)), key=in_flight.__getitem__)  # least-loaded replica
            in_flight[slot] += 1
            try:
                salt = plan.target.cache_salt(run_id, (item.suite, item.id, repeat))
                sample, reconnects = await request_one(transports[slot], item, repeat, plan.params, plan.model,
                                                       run.retries, rng, salt)
            except ServerContractError as exc:
                abort.append(exc)
                return
            finally:
                in_flight[slot] -= 1
            store.append(sample)
            live.answered()
            stats.done += 1
            if on_done is not None:
                on_done()
            stats.retries += sample.attempts - 1
            stats.reconnects += reconnects
            if sample.ok:
                stats.ok += 1
                stats.completion_tokens += sample.completion_tokens or 0
                consecutive_conn_failures = 0
            else:
                stats.failed += 1
                if sample.error and sample.error.startswith(("connection error", "timeout")):
                    consecutive_conn_failures += 1
                    if consecutive_conn_failures >= max(8, run.concurrency):
                        abort.append(InfrastructureError(
                            f"{plan.target.name}: {consecutive_conn_failures} requests in a row failed "
                            f"({sample.error}); is the server at {transports[slot].base_url} up?"))
                        return
            bar.update()

    async def flush_while_waiting() -> None:  # answers written within a second, however slow the next one is
        while True:
            await asyncio.sleep(FLUSH_SECONDS)
            store.flush()

    status = "incomplete"
    scraper = Scraper(plan.target.base_urls, plan.target.api_key())
    flusher = asyncio.create_task(flush_while_waiting())
    try:
        await scraper.start()  # inside: a failure or cancellation here still closes its connections
        for suite in plan.suites:
            names = {f"lm-eval:{t}" for t in suite.lmeval_tasks}
            if names and not any(k[0] in names for k in store.done):
                for sample in await asyncio.to_thread(_lmeval_samples, plan, suite, run):
                    store.append(sample)
                    total += 1
        for wave in cache_waves(units):  # a wave's prefixes are in the server's cache before the next is sent
            iterator = iter(wave)
            await live.guard(asyncio.gather(*(worker() for _ in range(max(1, min(run.concurrency, len(wave)))))))
            if abort:
                raise abort[0]
        status = "complete" if len(store.done) >= all_units else "partial"
    finally:
        # cancelled where it sleeps, so nothing of it runs again; not awaited: a cancellation of this
        # task arriving in that await would be taken for the flusher's own and swallowed
        flusher.cancel()
        bar.close()
        interrupted: BaseException | None = None  # a cancellation arriving here: connections and manifest first
        server_metrics = None
        try:
            server_metrics = await scraper.stop()
        except BaseException as exc:  # noqa: BLE001 - raised below, once the run is closed
            interrupted = exc
        try:
            await close_all(transports)
        except BaseException as exc:  # noqa: BLE001 - as above
            interrupted = interrupted or exc
        before = store.manifest.counts
        counts = {**before, "units": total, "ok": len(store.done) - len(store.unfit), "failed": total - len(store.done),
                  "does_not_fit": len(store.unfit),
                  "completion_tokens_this_session": stats.completion_tokens, "plan_units": all_units,
                  "retries": int(before.get("retries", 0)) + stats.retries,
                  "reconnects": int(before.get("reconnects", 0)) + stats.reconnects}
        failed_rate = (total - len(store.done)) / total if total else 0.0
        if status in ("complete", "partial") and failed_rate > 0:
            status = "incomplete"  # failed units are retried by the next run of the same command
        store.manifest = replace(store.manifest, status=status, finished_at=time.time(), counts=counts,
                                 server_metrics=(server_metrics if units and server_metrics
                                                 else store.manifest.server_metrics))
        store.write_manifest()
        store.close()
        if interrupted is not None:
            raise interrupted
    # in a compare (`judged`) an answer that is not data (NaN logprobs) is the server's own outcome, which the gate
    # judges (a candidate's broken prompt), and the rest stop a round only once shown above the bound, never on a
    # first look's share (2 of 124 at a 0.5% fault rate): the gate judges the failure rate at every look
    lost = total - len(store.done)
    if judged and failed_rate > run.max_failed_rate:
        lost = sum(1 for e in last_errors(store.run_dir) if not unusable_answer(e))
    if failures_shown_above(lost, total, run.max_failed_rate) if judged else failed_rate > run.max_failed_rate:
        raise InfrastructureError(
            f"{plan.target.name}: {total - len(store.done)} of {total} requests failed "
            f"({failed_rate:.1%} > max_failed_rate {run.max_failed_rate:.1%}: "
            f"{failure_summary(store.run_dir)}); errors are in "
            f"{store.run_dir}/samples.jsonl — run the same command again to retry them")
    return store.manifest


def _lmeval_samples(plan: RunPlan, suite: LoadedSuite, run: RunDefaults) -> list[Sample]:
    """lm-eval builds and scores its own requests; its per-sample results join the run's samples."""
    from kvqual.suites.lmeval import run_lmeval

    _, samples = run_lmeval(list(suite.lmeval_tasks), base_url=plan.target.base_url, model=plan.model,
                            limit=plan.limit, include_path=suite.include_path, api_key=plan.target.api_key(),
                            concurrency=min(run.concurrency, 16), max_gen_toks=run.max_tokens,
                            timeout_s=int(run.timeout), tokenizer=plan.target.tokenizer)
    return samples


def new_manifest(plan: RunPlan, concurrency: int, server_info: dict[str, Any]) -> RunManifest:
    from kvqual.provenance import git_revision, package_versions

    return RunManifest(
        run_id=plan.run_id, key=plan.key, target=plan.target.name, base_urls=plan.target.base_urls,
        model=plan.model, kv_cache_dtype=plan.target.kv_cache_dtype, suites=tuple(s.ref for s in plan.suites),
        params=plan.params, limit=plan.limit, replicate=plan.replicate, fraction=plan.fraction,
        concurrency=concurrency,
        status="running", started_at=time.time(), finished_at=None, counts={}, server_info=server_info,
        kvqual_version=__version__, git_revision=git_revision(), packages=package_versions(),
    )


async def run_target(target: Target, suites: tuple[LoadedSuite, ...], run: RunDefaults, *, limit: int | None = None,
                     replicate: int = 0, fraction: float = 1.0, rerun: bool = False,
                     progress: bool | None = None, items_upto: int | None = None,
                     on_done: Callable[[], None] | None = None, judged: bool = False) -> RunManifest:
    """Probe the target, find (or create) its run folder, and send what is not answered yet
    (of the first `items_upto` items in the seeded order, when given: one round). `judged`: a round of
    a compare, whose gate judges the failures (`execute`)."""
    from kvqual import probe

    info = await probe.describe(target.base_url, target.api_key(), timeout=probe.probe_timeout(run.timeout),
                                patience=run.timeout)
    model = target.model
    if model is None:
        if not info["models"]:
            raise InfrastructureError(f"{target.base_url}/models lists no model; set `model` for target {target.name}")
        model = info["models"][0]
    elif info["models"] and model not in info["models"]:
        raise InfrastructureError(f"{target.name}: model {model!r} is not served at {target.base_url} "
                                  f"(served: {', '.join(info['models'])})")
    params = GenerationParams(temperature=run.temperature, top_p=run.top_p, seed=run.seed, max_tokens=run.max_tokens,
                              top_logprobs=run.top_logprobs, repeats=run.repeats, stream=run.stream,
                              token_ids=run.top_logprobs > 0 and probe.speaks_token_ids(info))
    plan = RunPlan(target, model, suites, params, limit, replicate, fraction)
    lock = RunLock.acquire(Path(run.results_dir) / plan.run_id)  # one writer, before the server is touched
    store: RunStore | None = None
    try:
        if not rerun:
            existing = _finished(run.results_dir, plan)
            if existing is not None:
                return existing
            partial = _resumable(run.results_dir, plan, items_upto)
            if partial is not None:
                return partial
        flushed = await probe.flush_cache(target.base_url, target.api_key(), probe.probe_timeout(run.timeout))
        info["prefix_cache_flushed"] = flushed
        store = RunStore.open(run.results_dir, new_manifest(plan, run.concurrency, info), rerun=rerun, lock=lock)
        return await execute(plan, store, run, progress=progress, items_upto=items_upto, on_done=on_done,
                             judged=judged)
    finally:  # however it ends, the run folder is free for the next writer
        if store is not None:
            store.close()
        lock.release()


def _resumable(results_dir: str, plan: RunPlan, items_upto: int | None) -> RunManifest | None:
    """A partial run that already answered every unit of this round: nothing to send."""
    from kvqual.errors import KvqualError
    from kvqual.store import load_manifest, load_samples

    if items_upto is None:
        return None
    run_dir = Path(results_dir) / plan.run_id
    try:
        manifest = load_manifest(run_dir)
        done = {k for k, s in load_samples(run_dir).items() if s.ok}
    except KvqualError:
        return None
    wanted = plan_units(plan.suites, plan.params.repeats, plan.params.seed, plan.fraction, items_upto)
    if manifest.key != plan.key or any((i.suite, i.id, r) not in done for i, r in wanted):
        return None
    return manifest


def _finished(results_dir: str, plan: RunPlan) -> RunManifest | None:
    """A complete run of the same plan, reused instead of asking the server again — once its
    samples.jsonl is seen to hold every unit: a manifest that says complete over a samples file
    that lacks answers (a second writer, a hand edit) is resumed, and stderr says so."""
    from kvqual.errors import KvqualError
    from kvqual.store import load_manifest

    run_dir = Path(results_dir) / plan.run_id
    if not run_dir.is_dir():
        return None
    try:
        manifest = load_manifest(run_dir)
    except KvqualError:
        return None
    if manifest.status != "complete" or manifest.key != plan.key:
        return None
    missing = unanswered(plan, answered_keys(run_dir), int(manifest.counts.get("ok", 0)))
    if missing:
        print(f"kvqual: {run_dir}: the manifest says complete but samples.jsonl {missing}; "
              "resuming the run to ask for them", file=sys.stderr, flush=True)
        return None
    return manifest


def unanswered(plan: RunPlan, done: set[tuple[str, str, int]], ok_in_manifest: int) -> str | None:
    """What a run folder's answers `done` lack against `plan` and the manifest's ok count, in words
    (None: nothing)."""
    units = plan_units(plan.suites, plan.params.repeats, plan.params.seed, plan.fraction)
    missing = sum(1 for item, r in units if (item.suite, item.id, r) not in done)
    lmeval = [s.ref.name for s in plan.suites if s.lmeval_tasks
              and not any(k[0] in {f"lm-eval:{t}" for t in s.lmeval_tasks} for k in done)]
    if missing:
        return f"lacks {missing} of {len(units)} units"
    if lmeval:
        return f"lacks the answers of {', '.join(lmeval)}"
    if len(done) < ok_in_manifest:
        return f"holds {len(done)} answers, not the {ok_in_manifest} the manifest counts"
    return None
