"""`kvqual audit OUTPUTS --against REF [--candidate CAND]`: outputs a config already produced, judged
without generating them again (docs/audit.md).

A seeded, stratified sample of OUTPUTS (`suites.outputs.draw`) is judged in looks, as a compare is:
look k covers the first `sizes[k]` sampled outputs in the seeded item order (`gate.look_sizes`). For
each look the audit
1. generates the reference's own greedy outputs for the look's prompts with the same max_tokens (the
   floor; `runner.run_target`, a run folder like any other, so a second audit of the same prompts reuses it);
2. teacher-forces the floor outputs on the reference (`forcing.rounds.teacher_force`, with its check that
   the reference's echo scores its own outputs), and the audited outputs — as token ids, from the file or
   the reference's /tokenize — on the reference, and with a candidate on the candidate too, plus the
   reference a second time on the first look's first 32 (every one, if those do not reproduce bit for bit);
   The reference's passes ask for top-1 only (what `top1_loss` and the mean log-probability read) unless a
   candidate is given, whose KL needs the top-k of both; the candidate's pass runs beside the reference's
   (after it, where kvqual started both servers: they share this machine's cores).
3. asks the judge (`judge.audit.judge_audit`, pure over what was saved) and stops at the first decided
   look, at the end of the sample, or when the next look would overrun `max_minutes`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvqual.config import Config, RunDefaults, Target
from kvqual.errors import UsageError
from kvqual.forced import load_forced, teacher_file
from kvqual.forcing import rounds as forcing
from kvqual.forcing.teacher import TeacherForcer, force_all
from kvqual.gate import Verdict, look_sizes
from kvqual.judge.arms import Forcing, floor_reproduced, forcing_of
from kvqual.judge.audit import judge_audit
from kvqual.news import say
from kvqual.plan import item_order, next_round_time
from kvqual.probe import describe, probe_timeout
from kvqual.records import Item, RunManifest, Sample, SuiteRef, TokenLogprobs, dumps_line
from kvqual.runner import run_target
from kvqual.store import load_samples
from kvqual.suites import LoadedSuite, suite_hash
from kvqual.suites.outputs import SUITE, Drawn, Output

AA_PROBE = 32  # audited outputs the reference scores twice at the first look (as compare's flow does)


class Ticker:
    """A forcing pass's progress on stderr, a line every `every` seconds (long outputs take minutes to score)."""

    def __init__(self, what: str, total: int, every: float = 30.0) -> None:
        self.what, self.total, self.every = what, total, every
        self.done, self.started = 0, time.monotonic()
        self.last = self.started

    def __call__(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            say(f"{self.what}: {self.done}/{self.total} scored ({now - self.started:.0f} s)")


@dataclass
class AuditResult:
    verdict: Verdict
    figures: dict[str, Any]
    sizes: list[int]
    planned: list[int]
    stop: str
    floor_run: str | None


def _items(drawn: Drawn, max_tokens: int | None) -> dict[tuple[str, str], Item]:
    items = {}
    for o in drawn.outputs:
        limit = o.item.max_tokens or max_tokens
        if limit is None:
            raise UsageError(f"line {o.line} of the outputs does not say the max_tokens it was generated with, "
                             "and the floor must be generated with the same: give --max-tokens N")
        items[(SUITE, o.item.id)] = replace(o.item, max_tokens=limit)  # the same prompts: the same floor run
    return items


def _sample(o: Output, item: Item, ids: list[int] | None) -> Sample:
    """An audited output as a sample (the file's text and tokens; no request was sent for it). Where
    the file gives no finish reason, an output that reached max_tokens counts as truncated. `ids`
    None: no token ids (none in the file, no /tokenize on the reference): scored by text alignment, as
    a compare does, its length counted once the reference has scored it (`_text_lengths`)."""
    if ids is None:
        return Sample(item.id, SUITE, 0, o.text, o.finish_reason or "stop", None, None, context_id=item.context_id,
                      prompt_hash=item.prompt_hash)
    finish = o.finish_reason or ("length" if item.max_tokens is not None and len(ids) >= item.max_tokens else "stop")
    lp = TokenLogprobs(tokens=tuple("" for _ in ids), token_logprobs=tuple(None for _ in ids), token_ids=tuple(ids))
    return Sample(item.id, SUITE, 0, o.text, finish, len(ids), None, logprobs=lp, context_id=item.context_id,
                  prompt_hash=item.prompt_hash)


class Audit:
    """One `kvqual audit`: the looks, the forcing passes and the judging after each."""

    def __init__(self, config: Config, run: RunDefaults, drawn: Drawn, source: str, ref: Target,
                 cand: Target | None, out_dir: Path, max_tokens: int | None = None) -> None:
        self.config, self.drawn, self.ref, self.cand, self.out = config, drawn, ref, cand, out_dir
        self.run = replace(run, repeats=1, max_failed_rate=config.gate.max_failed_rate)
        self.items = _items(drawn, max_tokens)  # --max-tokens where the file does not say
        self.outputs = {o.item.id: o for o in drawn.outputs}
        # the floor's suite: the prompts by id, so that a file holding the same prompts in another order (the
        # outputs of another config) is the same suite, and its floor run is reused
        prompts = tuple(sorted(self.items.values(), key=lambda i: i.id))
        self.suite = LoadedSuite(SuiteRef(SUITE, source, suite_hash(prompts), len(prompts)), prompts)
        self.order = [(s, i, 0) for s, i in item_order(self.items, self.run.seed)]
        self.sizes = look_sizes(len(self.order), config.gate.looks, config.gate.first_look)
        self.audited: dict[tuple[str, str, int], Sample] = {}

    @property
    def top_k(self) -> int:
        """Top logprobs the audited outputs are scored with: the KL of a candidate against the reference
        needs top-k on both; without one, top-1 is all the judge reads (a third of the echo's bytes)."""
        return max(self.run.top_logprobs, 5) if self.cand is not None else 1

    def _forcer(self, target: Target, info: dict[str, Any], limit: int | None) -> TeacherForcer:
        """A forcer for `target` as `info` (what the server reported) describes it: its engine, its model."""
        model = target.model or next(iter(info.get("models") or []), "")
        return forcing.make_forcer(info, target.base_url, target.api_key(), model, self.top_k, self.run).limit_to(limit)

    async def _audited(self, forcer: TeacherForcer, keys: list[tuple[str, str, int]]) -> None:
        """The look's audited outputs as samples with token ids (the file's, else the reference's /tokenize;
        a reference without /tokenize: none, and they are scored by text alignment, counted)."""

        async def one(key: tuple[str, str, int]) -> None:
            o, item = self.outputs[key[1]], self.items[(key[0], key[1])]
            ids = list(o.token_ids) if o.token_ids else await forcer.completion_ids(o.text) if o.text else []
            self.audited[key] = _sample(o, item, ids)

        await asyncio.gather(*(one(k) for k in keys if k not in self.audited))

    def _text_lengths(self) -> None:
        """The length of each output scored by text alignment: its tokens as the reference scored them (a
        completion left unscored keeps none, and is left out of the length criteria as unanswered)."""
        forced = load_forced(self._file("reference"), logprobs=True)
        for key, sample in self.audited.items():
            f = forced.get(key)
            if sample.completion_tokens is None and f is not None and f.logprobs is not None:
                n, item = len(f.logprobs.tokens), self.items[(key[0], key[1])]
                finish = self.outputs[key[1]].finish_reason or (
                    "length" if item.max_tokens is not None and n >= item.max_tokens else "stop")
                self.audited[key] = replace(sample, completion_tokens=n, finish_reason=finish)
        self._save()

    async def execute(self) -> AuditResult:
        from kvqual.launch import serving

        rd = self.run.results_dir
        if self.cand is not None:
            async with serving(self.ref, rd) as ref, serving(self.cand, rd) as cand:
                return await self._looks(ref, cand)
        async with serving(self.ref, rd) as ref:
            return await self._looks(ref, None)

    async def _looks(self, ref: Target, cand: Target | None) -> AuditResult:
        self.out.mkdir(parents=True, exist_ok=True)
        limit = await forcing.common_window_limit(ref, cand, timeout=probe_timeout(self.run.timeout)) \
            if cand is not None else None
        cand_info = await describe(cand.base_url, cand.api_key(), timeout=probe_timeout(self.run.timeout)) \
            if cand is not None else {}
        started, spent, last = time.monotonic(), 0.0, 0.0
        verdict, figures, stop, floor_m = None, {}, "", None
        budget = (self.run.max_minutes or 0) * 60
        for k, n in enumerate(self.sizes):
            if k and budget:  # priced at the slower of all looks' rate and the last look's (plan.next_round_time)
                done = self.sizes[k - 1]
                total = spent + next_round_time(spent, done, last, done - (self.sizes[k - 2] if k > 1 else 0), n - done)
                if total > budget:
                    stop = (f"stopped before look {k + 1} ({n} outputs): at this rate it would take "
                            f"~{total / 60:.1f} min of the {budget / 60:g}-minute budget (--max-minutes)")
                    break
            look_began = time.monotonic()
            keys = self.order[:n]
            say(f"audit look {k + 1}/{len(self.sizes)}: {n} outputs")
            # the floor's own generation logprobs serve only the echo check (which reads the chosen token's)
            floor_m = await run_target(ref, (self.suite,), replace(self.run, top_logprobs=1), items_upto=n)
            floor_dir = Path(self.run.results_dir) / floor_m.run_id
            ref_forcer = self._forcer(ref, {"engine": floor_m.server_info.get("engine"), "models": [floor_m.model]},
                                      limit)
            try:
                await self._audited(ref_forcer, keys)
                self._save()
                samples = [self.audited[key] for key in keys]
                on_ref = self._on_reference(ref, ref_forcer, floor_m, floor_dir, keys, samples, k, limit)
                if cand is None or (ref.launch and cand.launch):  # two servers kvqual started share these cores
                    await on_ref
                    if cand is not None:
                        await self._on_candidate(cand, cand_info, samples, limit)
                else:
                    async with asyncio.TaskGroup() as passes:  # two servers: the two passes side by side
                        passes.create_task(on_ref)
                        passes.create_task(self._on_candidate(cand, cand_info, samples, limit))
            except BaseExceptionGroup as group:  # the first failure as itself (exit codes read its type)
                raise group.exceptions[0] from None
            finally:
                await ref_forcer.aclose()
            now = time.monotonic()
            spent, last = now - started, now - look_began
            verdict, figures = self._judge(floor_m, floor_dir, k + 1)
            figures["aligned_by_text"] = sum(1 for key in keys if self.audited[key].logprobs is None)
            if verdict.verdict != "INCONCLUSIVE" or verdict.infrastructure:
                stop = f"decided at look {k + 1} of {len(self.sizes)} ({n} outputs)"
                break
            stop = f"the sample is spent: all {n} outputs judged at look {k + 1} of {len(self.sizes)}"
        assert verdict is not None, "the first look always runs"
        taken = len([s for s in self.sizes if s <= figures.get("units", 0)])
        return AuditResult(verdict, figures, self.sizes[:taken], self.sizes, stop,
                           floor_m.run_id if floor_m else None)

    async def _on_reference(self, ref: Target, forcer: TeacherForcer, floor_m: RunManifest, floor_dir: Path,
                            keys: list[tuple[str, str, int]], samples: list[Sample], look: int,
                            limit: int | None) -> None:
        """The reference's passes of a look: its own outputs (the floor, top-1), the audited outputs, and with a
        candidate the A/A floor (the first look's first AA_PROBE scored twice; every output, if those differ)."""
        n = len(samples)
        await forcing.teacher_force(ref, floor_m, floor_dir, self.items, self.run, floor_dir,
                                    keys={(s, i) for s, i, _ in keys}, limit=limit, top_k=1,
                                    on_done=Ticker(f"teacher forcing {ref.name}'s own outputs", n))
        await self._force_audited(forcer, ref, samples, "reference")
        self._text_lengths()
        if self.cand is not None:
            again = self._file("reference-again")
            if look == 0:
                await force_all(forcer, self.items, samples[:AA_PROBE], again)
            if not self._reproduced(forcing_of(self._file("reference")), again):
                await force_all(forcer, self.items, samples, again)

    async def _on_candidate(self, cand: Target, info: dict[str, Any], samples: list[Sample],
                            limit: int | None) -> None:
        forcer = self._forcer(cand, info, limit)
        try:
            await self._force_audited(forcer, cand, samples, "candidate")
        finally:
            await forcer.aclose()

    async def _force_audited(self, forcer: TeacherForcer, target: Target, samples: list[Sample], scorer: str) -> None:
        """The audited outputs scored on `target` into forced-`scorer`.jsonl, with progress and the time it took."""
        t0 = time.perf_counter()
        await force_all(forcer, self.items, samples, self._file(scorer),
                        Ticker(f"teacher forcing the audited outputs on {target.name}", len(samples)))
        say(f"teacher forcing {len(samples)} audited outputs on {target.name}: {time.perf_counter() - t0:.0f} s, "
            f"{forcer.requests} requests{forcer.through_cache_note()}")

    def _reproduced(self, first: Forcing, again: Path) -> bool:
        return again.exists() and floor_reproduced(first, forcing_of(again))

    def _file(self, scorer: str) -> Path:
        return self.out / f"forced-{scorer}.jsonl"

    def _save(self) -> None:
        """The audited outputs judged so far, as samples (what the judge reads back with `kvqual audit` again)."""
        with open(self.out / "audited.jsonl", "w", encoding="utf-8") as fh:
            for key in self.order:
                if key in self.audited:
                    fh.write(dumps_line(self.audited[key].to_json()))

    def _judge(self, floor_m: RunManifest, floor_dir: Path, looks: int) -> tuple[Verdict, dict[str, Any]]:
        floor = load_samples(floor_dir, "inline")
        on_ref = forcing_of(self._file("reference"))
        floor_forced = forcing_of(teacher_file(floor_dir, floor_m.run_id))
        on_cand = forcing_of(self._file("candidate")) if self.cand is not None else None
        again = forcing_of(self._file("reference-again")) if self.cand is not None else None
        return judge_audit(self.items, self.audited, floor, on_ref, floor_forced, on_cand, again, self.order,
                           self.sizes[:looks], self.sizes, self.config.gate, self.run.seed,
                           {i: o.line for i, o in self.outputs.items()})
