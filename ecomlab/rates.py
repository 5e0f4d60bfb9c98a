"""Rates and ratios of whole runs, for the benchmarks: pooled rates, paired ratios, scaling ceilings and bounds.

Why apart from :mod:`ecomkit.metrics`: a training run measures itself there
(rows, throughput over its steady phase); the benchmarks compare runs with
these, never with a mean of rates, and always pair runs that ran side by side.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Sequence


def replicated_work_bound(n: int, replicated_fraction: float) -> float:
    """The best speed-up ``n`` data-parallel ranks can reach when part of the step is repeated on every rank.

    Amdahl's law with ``replicated_fraction`` of the one-process step not divided by ``n``: DDP splits the
    batch, but every rank still runs the whole optimizer step. With AdamW at 5 % of a one-process step, two
    ranks cannot beat 1.90x even with free communication. Read the fraction off :func:`time_split`
    (``optim``) of the one-process run.
    """
    if n < 1 or not 0.0 <= replicated_fraction <= 1.0:
        raise ValueError(f"need n >= 1 and 0 <= replicated_fraction <= 1, got n={n}, {replicated_fraction}")
    return 1.0 / ((1.0 - replicated_fraction) / n + replicated_fraction)


def concurrent_ceiling(alone_rate: float, concurrent_rates: list[float]) -> float:
    """How many times one process's throughput the machine gives when several independent copies run at once.

    Why: N data-parallel processes share the machine's memory bandwidth, caches and (on a VM) whatever the
    host gives the cores. Running N copies of the 1-process job side by side, with no communication at all,
    measures that ceiling; DDP's N/1 ratio cannot beat it. ``alone_rate`` is the copy's rate run alone.
    """
    if alone_rate <= 0 or not concurrent_rates or min(concurrent_rates) <= 0:
        raise ValueError(f"need positive rates, got alone={alone_rate}, concurrent={concurrent_rates}")
    return sum(concurrent_rates) / alone_rate


def pooled_rate(summaries: Sequence[dict[str, Any]], key: str = "samples_per_s") -> float:
    """One rate over repeated runs of the same job: their total samples (tokens) over their total steady time.

    Why: like one run's throughput, never a mean of rates; a run slowed by a
    neighbour weighs in by the time it took.
    """
    wall = sum(float(s["steady_wall_s"]) for s in summaries)
    if not summaries or wall <= 0:
        raise ValueError("need at least one run with a positive steady wall time")
    return sum(float(s[key]) * float(s["steady_wall_s"]) for s in summaries) / wall


@dataclass(frozen=True)
class PairedRatio:
    """Ratios of runs paired side by side (run i of one job against run i of the other), and their spread.

    Why: on a shared machine the capacity two processes get moves between
    minutes; each pair runs back to back so both sides see the same machine,
    and the median over the pairs is the verdict, with the range beside it.
    """

    ratios: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def spread(self) -> tuple[float, float]:
        return min(self.ratios), max(self.ratios)

    def describe(self) -> str:
        lo, hi = self.spread
        return f"median {self.median:.2f} of {len(self.ratios)} pairs (range {lo:.2f}-{hi:.2f})"


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> PairedRatio:
    """``numerators[i] / denominators[i]`` for each pair; both lists as long as each other and positive."""
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError(f"need as many numerators as denominators (>= 1), got {len(numerators)} and "
                         f"{len(denominators)}")
    if min(*numerators, *denominators) <= 0:
        raise ValueError("rates must be positive")
    return PairedRatio(tuple(n / d for n, d in zip(numerators, denominators)))


__all__ = ["PairedRatio", "concurrent_ceiling", "paired_ratios", "pooled_rate", "replicated_work_bound"]
