"""The sequential compare: rounds of items on both arms, judged after each, until decided or a budget is spent.

Round k covers the first sizes[k] items of the seeded item order (gate.look_sizes: 124 items,
then twice as many at each look up to the pool, at most `[gate] looks` of them; 1 = fixed-n). Each round runs the baseline, its
A/A generation replicate (the `aa_fraction` share of the round's items), teacher forcing of
the baseline's completions on the baseline (plus the A/A pass, which stops once a deterministic
server has reproduced it bit for bit) and on the candidate, every scoring server under one prompt
limit (the smaller of the servers' max_model_len: both arms score the same windows); then the gate judges everything so
far (`judge.judge`, pure over the saved files). Every answer lands in the run folders first,
so an interrupted compare resumes where it stopped.

When both servers can run at once (the built-in targets, or targets kvqual does not launch)
they stay up for the whole compare and the rounds alternate between them. Otherwise (`launch`
targets, which may need every GPU) the baseline runs all rounds first and the candidate is
judged round by round: the candidate's server time is what a decided verdict saves there.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvqual.compare.planfile import check_or_record, plan_of
from kvqual.compare.progress import CompareProgress
from kvqual.compare.verify import as_reported, verify
from kvqual.config import Config, RunDefaults, Target
from kvqual.forced import refusal, teacher_file
from kvqual.forcing import rounds as forcing
from kvqual.gate import GatePolicy, look_sizes
from kvqual.gate.tail import units_to_bound
from kvqual.judge.judge import judge
from kvqual.judge.record import Judgement, LookPlan
from kvqual.judge.arms import MIN_REPRODUCED, floor_reproduced, forcing_of
from kvqual.news import say
from kvqual.plan import item_order, next_round_time, plan_units
from kvqual.probe import probe_timeout
from kvqual.records import RunManifest
from kvqual.runner import progress_mode, run_target
from kvqual.store import load_samples
from kvqual.suites import LoadedSuite

if TYPE_CHECKING:
    from kvqual.load.evidence import LoadEvidence

# items of the first round forced twice on the baseline (the token criteria's A/A floor): when they reproduce
# bit for bit (a deterministic server, the GPUs seen so far) the floor is 0 for every item and no other item is
# forced twice; otherwise every item is (metrics.MIN_REPRODUCED is the least that counts as reproduced)
AA_PROBE = 32


@dataclass
class CompareState:
    """What the rounds produced so far."""

    bm: RunManifest | None = None
    am: RunManifest | None = None
    cm: RunManifest | None = None
    warnings: list[str] = field(default_factory=list)
    looks_taken: int = 0
    stop: str | None = None
    report: Judgement | None = None


def tail_plan(gate: GatePolicy, pool: int) -> str:
    """Before the compare starts: how many prompts a PASS needs to bound the share of broken ones at
    `max_broken_share` (gate/tail.py), and whether this compare's pool holds them."""
    need = units_to_bound(gate.max_broken_share, gate.alpha)
    assert need is not None  # with none broken it always grows
    text = (f"broken prompts: a PASS bounds their share at max_broken_share {gate.max_broken_share:.2%}, which takes "
            f"about {need:,} independent prompts with none broken")
    if pool < need:
        share = next(p / 1000 for p in range(1, 1000) if (units_to_bound(p / 1000, gate.alpha) or pool + 1) <= pool)
        text += (f"; this compare's {pool:,} items cannot hold them, so it can FAIL or stay INCONCLUSIVE but not PASS: "
                 f"give it more items, or set [gate] max_broken_share = {share:g} (what {pool:,} prompts can bound)")
    return text


def serve_together(config: Config, base: Target, cand: Target) -> bool:
    """Both servers up at once: the built-in targets (small, CPU) or targets kvqual does not start."""
    if config.run.serve_together is not None:
        return config.run.serve_together
    return config.builtin or (not base.launch and not cand.launch)


async def together(*aws: Any) -> list[Any]:
    """`asyncio.gather` that, when one part fails, cancels the others and waits until they have
    closed their connections and written their manifests, then raises the first failure as it is (a
    plain gather leaves them running while the command exits: an aiohttp session then outlives its
    loop, "Unclosed client session", and a manifest stays "running")."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class Compare:
    """One `kvqual compare BASE CAND`: the round loop, the budgets and the judging after each round."""

    def __init__(self, config: Config, run: RunDefaults, suites: tuple[LoadedSuite, ...], base_t: Target,
                 cand_t: Target, *, teacher_forcing: bool, allow_mismatch: bool, rerun: bool, command: str,
                 speed_from: LoadEvidence | None = None) -> None:
        # one failure policy for the whole compare, both arms alike: [gate] max_failed_rate is the share of
        # failed requests (after their retries) above which a run, its teacher forcing or the gate stops as an
        # infrastructure fault (exit 4); [run] max_failed_rate is for `kvqual run` and `kvqual load`
        run = replace(run, max_failed_rate=config.gate.max_failed_rate)
        self.config, self.run, self.suites = config, run, suites
        self.speed_from = speed_from  # a load.json the speedup criterion reads instead of the answers' speed
        self.base_t, self.cand_t = base_t, cand_t
        self.tf, self.allow_mismatch, self.rerun, self.command = teacher_forcing, allow_mismatch, rerun, command
        self.items = {(i.suite, i.id): i for s in suites for i in s.items}
        self.order = item_order(self.items, run.seed)
        pool = len(self.order) if run.max_items is None else min(run.max_items, len(self.order))
        self.pool = pool
        self.sizes = look_sizes(pool, config.gate.looks, config.gate.first_look)
        self.root = Path(run.results_dir)
        self.state = CompareState()
        self.started = time.monotonic()
        self.started_wall = time.time()  # an arm whose run finished before this is reused whole (`earlier`)
        self.rounds_started: float | None = None  # when the first round began (server starts are not server time)
        self.round_began: float | None = None  # when the latest round began
        self.next_look: dict[str, Any] | None = None  # the look a budget stopped before: its items and cost
        self.budget: str | None = None  # which budget stopped it: "max_minutes" or "budget_tokens"
        self.together = True
        self.tokens_spent = 0
        self.base_rounds, self.base_stop = len(self.sizes), None  # baseline rounds run (separate servers)
        # the prompt tokens a teacher-forcing window may hold on every scoring server of this comparison: the
        # smaller of the two servers' max_model_len − 1, so both arms score a long completion in the same windows
        self.window_limit: int | None = None
        self.probe_s = probe_timeout(run.timeout)  # what a server is asked about itself waits: --timeout, at most 30 s
        # overlap a round's parts on one server (fuller batches, ~a third less wall time on CPU) unless speed
        # is gated on the answers: then each arm's answers run alone, so its per-request speed is measured on
        # equal terms (a --speed-from load.json measured speed apart: the answers' speed is not judged)
        self.overlap = config.gate.min_speedup is None or speed_from is not None
        self.progress = CompareProgress(len(self.sizes), "off")

    # ------------------------------------------------------------ the plan, for the progress display

    def units(self, k: int, fraction: float = 1.0) -> int:
        """Requests of round k's new items in one arm (the A/A replicate: its `fraction` of them)."""
        run, low = self.run, self.sizes[k - 1] if k else 0
        return (len(plan_units(self.suites, run.repeats, run.seed, fraction, self.sizes[k]))
                - (len(plan_units(self.suites, run.repeats, run.seed, fraction, low)) if k else 0))

    def probe_units(self) -> int:
        """Requests of the first round's A/A teacher-forcing pass: the first AA_PROBE items."""
        return min(self.sizes[0], AA_PROBE) * self.run.repeats

    def planned_round(self, k: int, arm: str | None = None) -> int:
        """Every request of round k (`arm`: "baseline" or "candidate" only): both arms' answers, the
        A/A replicate's, and the forcing passes (two on the baseline in round 1; later rounds add the
        second only while the A/A floor has not reproduced). The progress display takes a round's
        requests when the round starts: a decided look or a budget may end the compare after any
        round, so the time left it shows is that of the round under way."""
        n = self.units(k)
        base = n + (self.units(k, self.run.aa_fraction) if self.run.aa_fraction > 0 else 0)
        base += n + (self.probe_units() if k == 0 else 0) if self.tf else 0
        cand = n + (n if self.tf else 0)
        return {"baseline": base, "candidate": cand}.get(arm or "", base + cand)

    # ------------------------------------------------------------ one round per arm

    async def base_round(self, t: Target, k: int) -> None:
        """The baseline's round: its answers, then teacher forcing of them on it, while the A/A
        replicate's answers run beside them on the same server (fuller batches, no idle tail)."""
        upto, first = self.sizes[k], k == 0
        run = self.run

        n, show, role = self.units(k), self.progress, "baseline"

        async def answers_then_forcing() -> RunManifest:
            with show.part(f"{role} answers", n) as tick:
                bm = await run_target(t, self.suites, run, judged=True, limit=run.limit, rerun=self.rerun and first,
                                      items_upto=upto, progress=False, on_done=tick)
            if self.tf:
                base_dir, keys = self.root / bm.run_id, set(self.order[:upto])

                async def force(planned: int, **how: Any) -> None:
                    with show.part(f"forcing on {role}", planned) as tick:
                        await forcing.teacher_force(t, bm, base_dir, self.items, run, own_dir=base_dir, keys=keys,
                                                    limit=self.window_limit, on_done=tick, **how)

                if first:  # the A/A pass on the first AA_PROBE items: a server that reproduces them bit for bit
                    # scores deterministically (floor 0 for all)
                    await force(n + self.probe_units(), again=True, again_keys=set(self.order[:min(upto, AA_PROBE)]),
                                check=True)
                if (not first or len(keys) > AA_PROBE) and not self._floor_reproduced(bm):
                    # a nondeterministic server: its floor is measured on every item
                    rest = n - (self.probe_units() if first else 0)
                    show.expect(rest)  # the plan counted on the floor reproducing
                    await force(rest if first else n * 2, again=True, check=False)
                elif not first:
                    await force(n, check=False)
            return bm

        async def replicate() -> RunManifest | None:
            if run.aa_fraction <= 0:
                return None
            with show.part("A/A replicate", self.units(k, run.aa_fraction)) as tick:
                return await run_target(t, self.suites, run, judged=True, limit=run.limit, replicate=1, fraction=run.aa_fraction,
                                        rerun=self.rerun and first, items_upto=upto, progress=False, on_done=tick)

        if self.overlap:
            self.state.bm, self.state.am = await together(answers_then_forcing(), replicate())
        else:
            self.state.bm = await answers_then_forcing()
            self.state.am = await replicate()
        self._spent()

    async def cand_round(self, t: Target, k: int) -> None:
        """The candidate's round: its answers, and teacher forcing of the baseline's on it. The echo
        check of the first round needs the candidate's own answers first; later rounds run both at once."""
        upto, first = self.sizes[k], k == 0
        bm = self.state.bm
        assert bm is not None
        if first:  # refuse a comparison of the wrong thing before spending server time on it
            reported = await as_reported(t, bm, self.probe_s)
            self.state.warnings = verify(bm, reported, self.allow_mismatch)
            if self.speed_from is not None:  # the load measured these servers (the candidate's URLs, not bm's)
                self.speed_from.check_served(bm, replace(reported, base_urls=tuple(t.base_urls)))

        n, show, role = self.units(k), self.progress, "candidate"

        async def answers() -> RunManifest:
            # `compare bf16 bf16` is an A/A check: the candidate is a fresh, independent run (replicate 2)
            # of a separately started server, never the baseline's own answers
            with show.part(f"{role} answers", n) as tick:
                return await run_target(t, self.suites, self.run, judged=True, limit=self.run.limit, rerun=self.rerun and first,
                                        replicate=2 if self.cand_t.name == self.base_t.name else 0, items_upto=upto,
                                        progress=False, on_done=tick)

        async def forced(cm: RunManifest) -> None:
            if self.tf:
                with show.part(f"forcing on {role}", n) as tick:
                    await forcing.teacher_force(t, cm, self.root / bm.run_id, self.items, self.run,
                                                own_dir=self.root / cm.run_id, keys=set(self.order[:upto]),
                                                check=first, limit=self.window_limit, on_done=tick)

        if first or self.state.cm is None or not self.overlap:
            self.state.cm = await answers()
            await forced(self.state.cm)
        else:
            self.state.cm, _ = await together(answers(), forced(self.state.cm))
        self._spent()

    def _candidate_window_limit(self, own: int | None) -> None:
        """Servers one at a time: the baseline's completions were scored on it under its own limit;
        the candidate's windows follow it unless the candidate admits less, when the pairs longer
        than that are scored in different windows, left out of the token metrics (WINDOWS_DIFFER)."""
        base = self.window_limit
        self.window_limit = own if base is None else base if own is None else min(base, own)
        if base is not None and own is not None and own < base:
            say(f"warning: {self.cand_t.name} admits {own} prompt tokens, {self.base_t.name} {base}, "
                "which scored the baseline's completions first: completions longer than that are scored "
                "in different windows and left out of the token metrics (give both servers the same "
                "max_model_len; docs/longgen.md)")

    def _floor_reproduced(self, bm: RunManifest) -> bool:
        base_dir = self.root / bm.run_id
        again = forcing_of(teacher_file(base_dir, bm.run_id, True))
        return floor_reproduced(forcing_of(teacher_file(base_dir, bm.run_id)), again) \
            and len(again.records) >= MIN_REPRODUCED

    def _echo_refused(self) -> str | None:
        """Why no later look may start once a server's echo failed the trust check (None: they may):
        its token criteria can never be judged, so no look can PASS and a further look could only find
        a FAIL; the compare stops at this look and says so."""
        s = self.state
        if not self.tf or s.bm is None or s.cm is None:
            return None
        base_dir = self.root / s.bm.run_id
        refused = [m.target for m in (s.cm, s.bm) if refusal(base_dir, m.run_id) is not None]
        if not refused:
            return None
        return (f"the echo of {refused[0]} failed the trust check, so the token criteria cannot be judged and no "
                "look can PASS: stopped here instead of taking looks that could only find a FAIL (fix the echo, "
                "or pass --no-teacher-forcing, and run again)")

    def _spent(self) -> None:
        """Generated tokens so far, every arm and the A/A replicate together (the token budget)."""
        self.tokens_spent = sum(sum(s.completion_tokens or 0 for s in load_samples(self.root / m.run_id, "inline").values())
                                for m in (self.state.bm, self.state.am, self.state.cm) if m is not None)

    # ------------------------------------------------------------ judging and budgets

    def judge(self, k: int) -> Judgement:
        s = self.state
        assert s.bm is not None and s.cm is not None
        if k == 0:  # the plan goes beside the answers; another plan for the same answers is refused (planfile.py)
            check_or_record(self.root / f"compare-{s.bm.run_id}-vs-{s.cm.run_id}",
                            plan_of(self.pool, self.sizes, self.config.gate), fresh=self.rerun)
        plan = LookPlan(self.pool, tuple(self.sizes[: k + 1] if s.stop else self.sizes), tuple(self.sizes), s.stop,
                        self.overlap, self.next_look if s.stop else None, self.budget if s.stop else None,
                        tuple(arm for arm, m in (("baseline", s.bm), ("candidate", s.cm))
                              if m.finished_at is not None and m.finished_at < self.started_wall))
        return judge(self.root / s.bm.run_id, self.root / s.cm.run_id,
                             self.root / s.am.run_id if s.am else None, self.config.gate, command=self.command,
                             teacher_forcing=self.tf, warnings=s.warnings, allow_mismatch=self.allow_mismatch,
                             seed=self.run.seed, plan=plan, speed_from=self.speed_from)

    def budget_left(self, k: int, arms_done: int = 2) -> str | None:
        """Why no further round may start after round k (None: it may). A budget only cuts a compare
        short: the next round is priced at the rate the rounds so far ran at (server time per item, both
        arms: `arms_done` of the two ran so far, as when the baseline's rounds run first; the slower of all
        rounds' rate and the last round's: `next_round_time`), and it starts only if it would end within
        `max_minutes`; the price of the look not taken goes in the report (`self.next_look`)."""
        run = self.run
        if k + 1 >= len(self.sizes):
            return None
        both = 2 / arms_done
        now = time.monotonic()
        minutes = (now - (self.rounds_started or self.started)) / 60 * both
        new_items = self.sizes[k + 1] - self.sizes[k]
        more = next_round_time(minutes, self.sizes[k], (now - (self.round_began or self.started)) / 60 * both,
                               self.sizes[k] - (self.sizes[k - 1] if k else 0), new_items)
        why = None
        if run.max_minutes and minutes + more > run.max_minutes:
            why = (f"max_minutes {run.max_minutes:g}: the next look ({self.sizes[k + 1]} items) would take "
                   f"~{more:.1f} more minutes at the rate so far, past the budget")
            self.budget = "max_minutes"
        elif run.budget_tokens is not None and self.tokens_spent >= run.budget_tokens:
            why = f"budget_tokens {run.budget_tokens} reached ({self.tokens_spent} generated)"
            self.budget = "budget_tokens"
        if why:
            self.next_look = {"look": k + 2, "items": self.sizes[k + 1], "minutes": round(more, 2),
                              "tokens": int(self.tokens_spent * both / self.sizes[k] * new_items)}
        return why

    def _decided_at(self, k: int) -> bool:
        """Judge after round k; True when the compare should stop (decided, or a budget spent)."""
        self.state.looks_taken = k + 1
        # both servers up: the budget is checked between rounds; one at a time: the baseline's rounds decided it
        self.state.stop = self.budget_left(k) if self.together else (
            self.base_stop if k + 1 == self.base_rounds else None)
        if self.state.stop is None and k + 1 < len(self.sizes):
            self.state.stop = self._echo_refused()
        with self.progress.part("judging", 0):
            report = self.judge(k)
        self.state.report = report
        # on its margin: the futility stop (gate/futility.py); requests that failed after their retries stop it
        # too: the gate judges no later look (exit 4)
        decided = report.decided or report.on_margin or report.verdict.infrastructure is not None
        say(f"look {k + 1}/{len(self.sizes)} ({self.sizes[k]} items): {report.verdict.verdict}"
            + (" — on its margin: stopped" if report.on_margin else "") + ("" if decided or k + 1 == len(self.sizes) or self.state.stop else " — next round"))
        return decided or self.state.stop is not None

    async def execute(self) -> Judgement:
        from kvqual.compare.earlier import recall
        from kvqual.launch import serving

        if not self.rerun:
            earlier = recall(self)
            if earlier is not None:  # every answer is on disk: no server needs to start to send nothing
                say(f"every answer and score of this compare is on disk from an earlier run of it: judged again "
                    f"without starting {self.base_t.name} or {self.cand_t.name} (--rerun asks the servers again)")
                return earlier
        together = self.together = serve_together(self.config, self.base_t, self.cand_t)
        rd = self.run.results_dir
        self.progress = show = CompareProgress(len(self.sizes), progress_mode(None))
        try:
            if together:
                async with serving(self.base_t, rd) as b, serving(self.cand_t, rd) as c:
                    if self.tf:
                        self.window_limit = await forcing.common_window_limit(b, c, timeout=self.probe_s)
                        say(tail_plan(self.config.gate, self.pool))
                    for k in range(len(self.sizes)):
                        show.expect(self.planned_round(k))
                        show.start_round(k)
                        self.round_began = time.monotonic()
                        self.rounds_started = self.rounds_started or self.round_began
                        await self.base_round(b, k)
                        await self.cand_round(c, k)
                        if self._decided_at(k):
                            break
            else:
                async with serving(self.base_t, rd) as b:
                    if self.tf:  # the candidate's server is not up yet: the baseline's own limit
                        self.window_limit = await forcing.common_window_limit(b, timeout=self.probe_s)
                        say(tail_plan(self.config.gate, self.pool))
                    for k in range(len(self.sizes)):
                        show.expect(self.planned_round(k, "baseline"))
                        show.start_round(k)
                        self.round_began = time.monotonic()
                        self.rounds_started = self.rounds_started or self.round_began
                        await self.base_round(b, k)
                        self.base_rounds, self.base_stop = k + 1, self.budget_left(k, arms_done=1)
                        if self.base_stop:
                            break
                async with serving(self.cand_t, rd) as c:
                    if self.tf:
                        self._candidate_window_limit(await forcing.common_window_limit(c, timeout=self.probe_s))
                    for k in range(self.base_rounds):
                        show.expect(self.planned_round(k, "candidate"))
                        show.start_round(k)
                        await self.cand_round(c, k)
                        if self._decided_at(k):
                            break
        finally:
            show.close()
        assert self.state.report is not None
        return self.state.report
