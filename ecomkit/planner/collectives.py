"""The α-β model of ring collectives: seconds to all-reduce, all-gather or reduce-scatter ``S`` bytes over ``N`` ranks.

Why its own module: ``step_time`` and ``split_time`` price their collectives the same way, from
:class:`ecomkit.planner.links.LinkSpec`'s latency α and bus bandwidth ``B``.
"""

from __future__ import annotations

from ecomkit.planner.links import LinkSpec


def all_reduce_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring all-reduce: a reduce-scatter then an all-gather, ``2(N-1)`` steps of ``S/N`` bytes."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bus_bytes_per_s


def all_gather_s(nbytes: float, n: int, link: LinkSpec) -> float:
    """Ring all-gather of a tensor of ``nbytes`` in total (each rank contributes ``nbytes / N``)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bus_bytes_per_s


reduce_scatter_s = all_gather_s   # same steps and bytes, the other direction
COLLECTIVE_TIME = {"all_reduce": all_reduce_s, "all_gather": all_gather_s, "reduce_scatter": reduce_scatter_s}


__all__ = ["all_reduce_s", "all_gather_s", "reduce_scatter_s", "COLLECTIVE_TIME"]
