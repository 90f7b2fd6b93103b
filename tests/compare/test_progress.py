"""The compare's one progress display: requests against the plan, what runs now, the estimate."""

from __future__ import annotations

import time

from kvqual.compare.progress import CompareProgress, fmt_duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_parts_count_requests_and_reused_ones_are_not_in_the_rate():
    clock = Clock()
    p = CompareProgress(2, "off", clock=clock)
    p.expect(100)
    clock.now += 40  # servers starting: in the elapsed time, not in the rate
    p.start_round(0)
    assert p.left_s() is None and p.describe() == "round 1/2: starting"
    with p.part("baseline answers", 30) as tick:
        for _ in range(10):  # 20 of the 30 were answered in an earlier session
            tick()
        with p.part("A/A replicate", 5) as aa:
            assert p.describe() == "round 1/2: baseline answers + A/A replicate"
            aa()
    clock.now += 11
    assert (p.done, p.reused, p.total) == (35, 24, 100)
    assert p.left_s() == 11 / 11 * 65  # 11 requests sent in 11 s, 65 left
    assert p.times() == "0:51 elapsed, ~1:05 left in this round"  # an estimate at the rate so far, not a bound


def test_more_requests_than_planned_grow_the_plan():
    p = CompareProgress(1, "off", clock=Clock())
    p.expect(2)
    p.start_round(0)
    with p.part("forcing on candidate", 2) as tick:
        for _ in range(3):
            tick()
    assert (p.done, p.total) == (3, 3)


def test_lines_mode_prints_a_line_per_round_and_at_the_end(capsys):
    clock = Clock()
    p = CompareProgress(4, "lines", clock=clock)
    p.expect(8)
    p.start_round(1)
    with p.part("candidate answers", 8) as tick:
        tick()
        clock.now += 31  # past LINE_EVERY_S: the next request prints a line
        tick()
    p.close()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "kvqual: compare round 2/4: starting: 0/8 requests, 0:00 elapsed"
    assert err[1] == ("kvqual: compare round 2/4: candidate answers: 2/8 requests, 0:31 elapsed, ~1:33 left in "
                      "this round")
    assert err[-1] == ("kvqual: compare: 2 requests sent, 6 not sent (answered in the run folders by an earlier run, "
                       "or skipped) in 0:31")


def test_lines_keep_coming_while_no_request_finishes(capsys, monkeypatch):
    """A part whose requests take minutes (long generations on a busy CPU) once left a CI log silent
    for 4 minutes under a promise of a line every 30 s: the heartbeat prints them anyway."""
    import kvqual.compare.progress as progress

    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.5)
    p = CompareProgress(1, "lines", heartbeat=True)
    p.expect(4)
    p.start_round(0)
    with p.part("baseline answers", 4):
        time.sleep(3.2)  # no request finishes
    p.close()
    lines = [line for line in capsys.readouterr().err.splitlines() if "baseline answers: 0/4" in line]
    assert len(lines) >= 3, lines  # the heartbeat wakes every second and prints when 0.5 s passed


def test_fmt_duration():
    assert [fmt_duration(s) for s in (0, 59.6, 65, 760, 3723)] == ["0:00", "1:00", "1:05", "12:40", "1:02:03"]


def test_an_interrupted_part_does_not_count_its_unsent_requests_as_answered_before():
    """SIGTERM mid-part once printed "88 requests sent, 60 not sent (answered … by an earlier run)"."""
    p = CompareProgress(1, "off", clock=Clock())
    p.expect(10)
    p.start_round(0)
    try:
        with p.part("baseline answers", 10) as tick:
            tick()
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert (p.done, p.reused) == (1, 0)
