"""One progress display for a whole `kvqual compare`: the round, what runs now, requests done of
those planned, time spent and an estimate of the time left.

Every request the compare sends counts as one unit: each arm's answers, the A/A replicate's and
every teacher-forcing pass. A round's requests join the plan when the round starts (a decided look
or a budget may end the compare after any round, so the plan is never the rounds it will not run),
and the estimate ("~ 1:05 left in this round") is of the rounds started so far: the units left at
the rate of this session's units, generation and forcing requests averaged together. It is an
estimate, not a bound: requests of a later part may be slower (long generations) and a decided look
or a budget decides whether another round starts (`--max-minutes` prices each round before it starts).
Units not sent (answered in the run folders by an earlier session, or skipped, as a refused echo's
forcing pass) count as done but not in the rate.

On a terminal it is a rich progress bar on stderr; elsewhere (CI logs, pipes) one plain line when
each round starts and every `LINE_EVERY_S` seconds, whether or not a request finished (a heartbeat
thread: a part whose requests take minutes must not look like a hang). The rate is measured from the
first round's start, so the servers' start-up is in the time spent but not in the estimate.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time
from typing import Callable, Iterator

LINE_EVERY_S = 30.0


def fmt_duration(seconds: float) -> str:
    """`1:05`, `12:40`, `1:02:03`."""
    s = max(0, int(round(seconds)))
    h, m, s = s // 3600, s // 60 % 60, s % 60
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class CompareProgress:
    """Counts a compare's requests against its plan and shows them (mode "bar", "lines" or "off")."""

    def __init__(self, rounds: int, mode: str, clock=time.monotonic, heartbeat: bool | None = None) -> None:
        self.rounds, self.mode, self.clock = rounds, mode, clock
        self.total = self.done = self.reused = 0
        self.round = 0
        self.active: collections.Counter[str] = collections.Counter()
        self.started = self._last_line = clock()
        self.first_round: float | None = None  # the rate leaves out the servers' start-up
        self._bar = self._task = None
        if mode == "bar":
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[times]}"), console=Console(stderr=True),
                                 transient=False, refresh_per_second=4)
            self._task = self._bar.add_task("compare", total=1, times="")
            self._bar.start()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        if mode == "lines" and (heartbeat if heartbeat is not None else clock is time.monotonic):
            self._beat = threading.Thread(target=self._heartbeat, name="kvqual-progress", daemon=True)
            self._beat.start()

    def _heartbeat(self) -> None:
        """A line every LINE_EVERY_S seconds while nothing else prints one."""
        while not self._stop.wait(1.0):
            if self.clock() - self._last_line >= LINE_EVERY_S:
                self._line()

    # ------------------------------------------------------------ counting

    def expect(self, units: int) -> None:
        """Add `units` requests to the plan: every planned round's parts at the start, a forcing
        pass found necessary later."""
        self.total += max(0, units)
        self._show()

    def start_round(self, k: int) -> None:
        self.round = k
        if self.first_round is None:
            self.first_round = self.clock()
        if self.mode == "lines":
            self._line()

    @contextlib.contextmanager
    def part(self, name: str, planned: int) -> Iterator[Callable[[], None]]:
        """One part of a round, e.g. "bf16 answers", with its `planned` requests (already in the
        plan): yields the callback to call per request done. Parts that run at once are shown
        together. When the part ends, requests planned but not sent (answered in an earlier
        session, or skipped: a refused echo is not forced) count as done, not in the rate."""
        self.active[name] += 1
        sent = 0

        def tick() -> None:
            nonlocal sent
            sent += 1
            self.done += 1
            self.total = max(self.total, self.done)
            self._show()

        self._show()
        finished = False
        try:
            yield tick
            finished = True
        finally:
            if finished and planned > sent:  # an interrupted part's unsent requests are not "not needed"
                self.done += planned - sent
                self.reused += planned - sent
            self.active[name] -= 1
            if not self.active[name]:
                del self.active[name]
            self._show()

    # ------------------------------------------------------------ showing

    def left_s(self) -> float | None:
        """Seconds left at this session's rate (None before the first request sent here)."""
        sent = self.done - self.reused
        if sent <= 0 or self.first_round is None:
            return None
        return (self.clock() - self.first_round) / sent * (self.total - self.done)

    def describe(self) -> str:
        what = " + ".join(self.active) or "starting"
        return f"round {self.round + 1}/{self.rounds}: {what}"

    def times(self) -> str:
        left = self.left_s()
        return (f"{fmt_duration(self.clock() - self.started)} elapsed"
                + ("" if left is None else f", ~{fmt_duration(left)} left in this round"))

    def _line(self) -> None:
        with self._lock, contextlib.suppress(OSError):  # a terminal that hung up must not stop the compare
            print(f"kvqual: compare {self.describe()}: {self.done}/{self.total} requests, {self.times()}",
                  file=sys.stderr, flush=True)
            self._last_line = self.clock()

    def _show(self) -> None:
        if self._bar is not None:
            self._bar.update(self._task, description=self.describe(), completed=self.done,
                             total=max(self.total, 1), times=self.times())
        elif self.mode == "lines" and self.clock() - self._last_line >= LINE_EVERY_S:
            self._line()

    def close(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        if self._bar is not None:
            self._show()
            self._bar.stop()
        elif self.mode == "lines":
            print(f"kvqual: compare: {self.done - self.reused} requests sent"
                  + (f", {self.reused} not sent (answered in the run folders by an earlier run, or skipped)"
                     if self.reused else "")
                  + f" in {fmt_duration(self.clock() - self.started)}", file=sys.stderr, flush=True)
