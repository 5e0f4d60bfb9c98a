"""The barrier-synchronised timer of :mod:`ecomkit.dist`, in one process."""

from __future__ import annotations

import statistics
import time

from ecomkit.dist import timed, timed_phases


def test_phases_alternate_and_each_gets_its_own_median():
    calls = []

    def fast() -> None:
        calls.append("fast")

    def slow() -> None:
        calls.append("slow")
        time.sleep(0.02)

    fast_s, slow_s = timed_phases([fast, slow], repeats=3, warmup=1)
    assert calls == ["fast", "slow"] * 4              # one warm-up round, then three, always in order
    assert slow_s >= 0.02 > fast_s


def test_timed_is_one_phase():
    n = []
    assert 0.01 <= timed(lambda: n.append(time.sleep(0.01)), repeats=3, warmup=0) < 0.5
    assert len(n) == 3                                   # no warm-up call


def test_the_average_can_be_the_mean_so_a_slow_run_counts():
    durations = iter([0.0, 0.0, 0.0, 0.06])           # warm-up, then three runs: one slow

    def work() -> None:
        time.sleep(next(durations))

    assert timed(work, repeats=3, warmup=1, average=statistics.fmean) >= 0.02   # the slow run weighs in
    durations = iter([0.0, 0.0, 0.0, 0.06])
    assert timed(work, repeats=3, warmup=1) < 0.02                               # the median leaves it out
