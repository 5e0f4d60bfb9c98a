"""How much of a padded batch is padding: the number length bucketing is meant to cut.

Padded positions / total positions, each micro-batch right-padded to its longest member.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ecomkit.data.sampler import DistributedBatchSampler


def padding_rate(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Padded positions / total positions over ``batches`` (lists of indices into ``lengths``)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = real = 0
    for batch in batches:
        if len(batch) == 0:
            continue
        lens = lengths[np.asarray(batch)]
        total += int(lens.max()) * len(lens)
        real += int(lens.sum())
    return (total - real) / total if total else 0.0


@dataclass(frozen=True)
class PaddingComparison:
    """Padding rates of bucketed and random batching over the same data and batch shape."""

    bucketed: float
    random: float
    micro_batch_size: int
    global_batch_size: int

    @property
    def ratio(self) -> float:
        """How many times more padding random batching has (inf if bucketed has none)."""
        return self.random / self.bucketed if self.bucketed > 0 else float("inf")

    def summary(self) -> str:
        return (f"padding rate with micro-batch {self.micro_batch_size} (global batch {self.global_batch_size}): "
                f"bucketed {self.bucketed:.1%}, random {self.random:.1%}, random/bucketed = {self.ratio:.1f}x")


def epoch_micro_batches(lengths: Sequence[int], micro_batch_size: int, grad_accum: int, num_replicas: int,
                        seed: int, epoch: int, bucketed: bool) -> list[list[int]]:
    """All micro-batches of one epoch, over all ranks, exactly as the samplers would yield them."""
    out = []
    for rank in range(num_replicas):
        sampler = DistributedBatchSampler(lengths, micro_batch_size, grad_accum, num_replicas, rank, seed,
                                          bucketed=bucketed)
        sampler.set_epoch(epoch)
        out.extend(sampler)
    return out


def compare_padding(lengths: Sequence[int], micro_batch_size: int = 8, grad_accum: int = 1,
                    num_replicas: int = 1, seed: int = 0, epoch: int = 0) -> PaddingComparison:
    """Measure the padding rate of bucketed vs random batching on ``lengths``."""
    rates = {
        mode: padding_rate(lengths, epoch_micro_batches(lengths, micro_batch_size, grad_accum, num_replicas,
                                                        seed, epoch, bucketed=(mode == "bucketed")))
        for mode in ("bucketed", "random")
    }
    return PaddingComparison(rates["bucketed"], rates["random"], micro_batch_size,
                             micro_batch_size * grad_accum * num_replicas)


def rank_step_costs(lengths: Sequence[int], micro_batch_size: int, grad_accum: int, num_replicas: int,
                    seed: int = 0, epoch: int = 0, bucketed: bool = True) -> np.ndarray:
    """Padded positions each rank computes in each optimizer step: an array ``[num_replicas, steps]``.

    From the samplers' plan, without training: per micro-batch ``len * longest`` (attention's quadratic term left out).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    costs = []
    for rank in range(num_replicas):
        sampler = DistributedBatchSampler(lengths, micro_batch_size, grad_accum, num_replicas, rank, seed,
                                          bucketed=bucketed)
        sampler.set_epoch(epoch)
        micro = [len(b) * int(lengths[np.asarray(b)].max()) for b in sampler]
        costs.append([sum(micro[i:i + grad_accum]) for i in range(0, len(micro), grad_accum)])
    return np.asarray(costs, dtype=np.float64)


def wait_fraction(costs: np.ndarray) -> float:
    """Share of the ranks' time spent waiting for the slowest rank of each step (0 when balanced).

    Each step lasts as long as its busiest rank: ``1 - sum_k mean_r / sum_k max_r`` over ``costs[r, k]``.
    """
    costs = np.asarray(costs, dtype=np.float64)
    busiest = costs.max(axis=0).sum()
    return float(1.0 - costs.mean(axis=0).sum() / busiest) if busiest > 0 else 0.0


@dataclass(frozen=True)
class RankWait:
    """Wait at the per-step all-reduce caused by uneven batches, for bucketed and random batching."""

    bucketed: float
    random: float
    micro_batch_size: int
    grad_accum: int
    num_replicas: int

    def summary(self) -> str:
        return (f"ranks waiting for the slowest rank (micro-batch {self.micro_batch_size} x accum {self.grad_accum} "
                f"x {self.num_replicas} ranks): bucketed {self.bucketed:.1%}, random {self.random:.1%} of rank time")


def compare_rank_wait(lengths: Sequence[int], micro_batch_size: int, grad_accum: int, num_replicas: int,
                      seed: int = 0, epoch: int = 0) -> RankWait:
    """:func:`wait_fraction` of the samplers' plan, bucketed and random, on the same data and batch shape."""
    rates = {mode: wait_fraction(rank_step_costs(lengths, micro_batch_size, grad_accum, num_replicas, seed, epoch,
                                                 bucketed=(mode == "bucketed")))
             for mode in ("bucketed", "random")}
    return RankWait(rates["bucketed"], rates["random"], micro_batch_size, grad_accum, num_replicas)
