"""How much of a padded batch is padding: the number length bucketing is meant to cut.

Padding rate = padded positions / total positions, when every micro-batch is
padded (right) to its longest member. It is the fraction of the matrix
multiplications spent on pad tokens (attention is masked, but still computed).
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
