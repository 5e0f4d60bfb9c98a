"""The one barrier-synchronised timer of the lab: each run of a function started together on all ranks.

Why a barrier before every run: no rank then times its wait for a late peer; CUDA is synchronised before the clock.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist


def barrier_if_distributed() -> None:
    """``dist.barrier()`` when a process group exists; nothing for a single process."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1, device: torch.device | None = None,
          average: Callable[[list[float]], float] = statistics.median, slowest: bool = False) -> float:
    """Median (or ``average``) seconds of ``fn`` over ``repeats`` runs, each started together on all ranks.

    A barrier before every run, so no rank times its wait for a late peer; CUDA is synchronised before the clock.
    """
    return timed_phases([fn], repeats, warmup, device, average, slowest)[0]


def timed_phases(fns: Sequence[Callable[[], Any]], repeats: int = 5, warmup: int = 1,
                 device: torch.device | None = None,
                 average: Callable[[list[float]], float] = statistics.median,
                 slowest: bool = False) -> list[float]:
    """Median (or ``average``) seconds of each of ``fns``, run in order ``repeats`` times, all ranks together.

    For phases that must alternate (a DeepSpeed backward and step); ``slowest`` counts each run at its slowest rank.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, phase_times in zip(fns, times):
            barrier_if_distributed()
            _synchronize(device)
            t0 = time.perf_counter()
            fn()
            _synchronize(device)
            phase_times.append(time.perf_counter() - t0)
    if slowest and dist.is_available() and dist.is_initialized():
        on = device if device is not None and device.type == "cuda" else torch.device("cpu")
        flat = torch.tensor(times, dtype=torch.float64, device=on)
        dist.all_reduce(flat, op=dist.ReduceOp.MAX)
        times = flat.tolist()
    return [average(t) for t in times]
