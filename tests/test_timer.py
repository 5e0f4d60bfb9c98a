"""The barrier-synchronised timer of :mod:`ecomlab.timing`, in one process."""

from __future__ import annotations

import statistics
import time

import pytest

from ecomlab.timing import timed, timed_phases


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


def _slowest_worker(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    own = timed(lambda: time.sleep(0.01 + 0.05 * rank), repeats=2, warmup=0, average=statistics.fmean)
    slow = timed(lambda: time.sleep(0.01 + 0.05 * rank), repeats=2, warmup=0, average=statistics.fmean,
                 slowest=True)
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{own} {slow}")
    dist.destroy_process_group()


@pytest.mark.dist
def test_slowest_counts_each_run_at_the_slowest_ranks_time(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_slowest_worker, args=(str(tmp_path / "store"), str(tmp_path / "t")), nprocs=2)
    own0, slow0 = map(float, (tmp_path / "t.0").read_text().split())
    own1, slow1 = map(float, (tmp_path / "t.1").read_text().split())
    assert own0 < 0.05 <= own1                      # each rank's own time
    assert slow0 == slow1 >= 0.06                   # both see rank 1's
