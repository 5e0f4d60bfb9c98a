"""Length-bucketed, distributed batch sampling planned as *global* batches.

Every rank computes the same global batches from ``(seed, epoch)`` and takes a contiguous slice: one step is one
global batch whatever the process count (1×4 and 2×2 runs see the same samples), ranks never overlap, and a
checkpoint stores only ``(epoch, batches consumed)``. Sorting mega-chunks by length cuts padding, and since all ranks
of a step draw from one bucket, none waits on another's long bucket.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ecomkit.data.lengths import check_batch_layout, epoch_rng
from ecomkit.errors import ConfigError

CHUNK_GLOBAL_BATCHES = 64


def plan_global_batches(lengths: Sequence[int], global_batch_size: int, seed: int, epoch: int,
                        bucketed: bool = True, drop_last: bool = True,
                        chunk_batches: int = CHUNK_GLOBAL_BATCHES) -> list[list[int]]:
    """Return the epoch's global batches (lists of sample indices), identical for identical arguments.

    ``bucketed``: shuffle, sort mega-chunks of ``chunk_batches`` batches by length, cut, shuffle the batch order.
    ``drop_last=False`` keeps the leftover samples as one smaller final batch.
    """
    full, partial = plan_arrays(lengths, global_batch_size, seed, epoch, bucketed, drop_last, chunk_batches)
    return full.tolist() + ([partial.tolist()] if len(partial) else [])


def plan_arrays(lengths: Sequence[int], global_batch_size: int, seed: int, epoch: int, bucketed: bool = True,
                drop_last: bool = True, chunk_batches: int = CHUNK_GLOBAL_BATCHES) -> tuple[np.ndarray, np.ndarray]:
    """The plan of :func:`plan_global_batches` as arrays: full batches ``[n_full, global_batch_size]`` and the leftover.

    Vectorised and held as int64 arrays, so a 10 M-row epoch is planned in seconds without 10 M Python ints.
    """
    if global_batch_size < 1:
        raise ConfigError(f"the global batch (--global-batch-size) must be >= 1, got {global_batch_size}.")
    lengths = np.asarray(lengths)
    rng = epoch_rng(seed, epoch)
    order = rng.permutation(len(lengths))
    n_full = len(order) // global_batch_size
    if drop_last:
        order = order[: n_full * global_batch_size]
    if bucketed and len(order):
        chunk_of = np.arange(len(order)) // (chunk_batches * global_batch_size)
        order = order[np.lexsort((lengths[order], chunk_of))]   # by chunk, then by length; stable on ties
    full = order[: n_full * global_batch_size].reshape(n_full, global_batch_size)
    if bucketed:
        full = full[rng.permutation(n_full)]
    return full, order[n_full * global_batch_size:]


class DistributedBatchSampler:
    """A DataLoader ``batch_sampler`` yielding this rank's micro-batches of one global plan.

    Each rank takes its contiguous ``micro_batch_size * grad_accum`` slice of a global batch as ``grad_accum``
    micro-batches. ``drop_last=False`` (evaluation) splits the last batch evenly across ranks, so some get fewer
    micro-batches. ``state_dict()`` counts global batches handed out; with DataLoader workers, which prefetch, build the
    state from the loop's step count instead.
    """

    def __init__(self, lengths: Sequence[int], micro_batch_size: int, grad_accum: int, num_replicas: int,
                 rank: int, seed: int, bucketed: bool = True, drop_last: bool = True,
                 chunk_batches: int = CHUNK_GLOBAL_BATCHES):
        check_batch_layout(micro_batch_size, grad_accum, num_replicas, rank)
        self.lengths = np.asarray(lengths)
        if self.lengths.dtype.kind not in "iu":
            self.lengths = self.lengths.astype(np.int64)
        self.micro_batch_size, self.grad_accum = micro_batch_size, grad_accum
        self.num_replicas, self.rank, self.seed = num_replicas, rank, seed
        self.bucketed, self.drop_last, self.chunk_batches = bucketed, drop_last, chunk_batches
        self.per_rank = micro_batch_size * grad_accum
        self.global_batch_size = self.per_rank * num_replicas
        if drop_last and len(self.lengths) < self.global_batch_size:
            raise ConfigError(
                f"The data set has {len(self.lengths)} samples but one global batch needs "
                f"{self.global_batch_size} (--micro-batch-size {micro_batch_size} x --grad-accum {grad_accum} x "
                f"{num_replicas} processes), so an epoch would have no step. Use more data or a smaller "
                f"--micro-batch-size/--grad-accum.")
        self.epoch = 0
        self.consumed = 0
        self._resumed = False

    @property
    def steps_per_epoch(self) -> int:
        """Global batches (optimizer steps) per epoch."""
        n, g = len(self.lengths), self.global_batch_size
        return n // g if self.drop_last else -(-n // g)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's plan. A new epoch restarts at its first batch; the same epoch keeps a resume point."""
        if epoch != self.epoch:
            self.consumed, self._resumed = 0, False
        self.epoch = epoch

    def plan(self) -> list[list[int]]:
        """The current epoch's global batches (the same list on every rank)."""
        return plan_global_batches(self.lengths, self.global_batch_size, self.seed, self.epoch,
                                   self.bucketed, self.drop_last, self.chunk_batches)

    def rank_micro_batches(self, global_batch: list[int]) -> list[list[int]]:
        """This rank's micro-batches of one global batch."""
        mb = self.micro_batch_size
        if len(global_batch) == self.global_batch_size:
            mine = global_batch[self.rank * self.per_rank:(self.rank + 1) * self.per_rank]
        else:
            mine = np.array_split(np.asarray(global_batch, dtype=np.int64), self.num_replicas)[self.rank].tolist()
        return [mine[i:i + mb] for i in range(0, len(mine), mb)]

    def __iter__(self) -> Iterator[list[int]]:
        full, partial = plan_arrays(self.lengths, self.global_batch_size, self.seed, self.epoch, self.bucketed,
                                    self.drop_last, self.chunk_batches)
        n_steps = len(full) + (1 if len(partial) else 0)
        if self.consumed >= n_steps and not self._resumed:
            self.consumed = 0  # iterating a finished epoch again replays it, like torch's samplers
        self._resumed = False
        for step in range(self.consumed, n_steps):
            micro = self.rank_micro_batches((full[step] if step < len(full) else partial).tolist())
            for i, batch in enumerate(micro):
                if i == len(micro) - 1:
                    self.consumed = step + 1
                yield batch
            if not micro:
                self.consumed = step + 1

    def __len__(self) -> int:
        """Micro-batches this rank yields in a full epoch."""
        full = self.steps_per_epoch if self.drop_last else len(self.lengths) // self.global_batch_size
        count = full * self.grad_accum
        leftover = len(self.lengths) - full * self.global_batch_size
        if not self.drop_last and leftover:
            share = len(np.array_split(np.arange(leftover), self.num_replicas)[self.rank])
            count += -(-share // self.micro_batch_size)
        return count

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed_global_batches": self.consumed, "seed": self.seed,
                "global_batch_size": self.global_batch_size, "num_samples": len(self.lengths),
                "bucketed": self.bucketed, "drop_last": self.drop_last}

    def load_state_dict(self, state: dict) -> None:
        """Continue after ``state["consumed_global_batches"]`` of ``state["epoch"]``.

        Seed, global batch size, sample count and batching mode must match; the process count may differ.
        """
        for key in ("seed", "global_batch_size", "num_samples", "bucketed", "drop_last"):
            mine = self.state_dict()[key]
            if key in state and state[key] != mine:
                raise ConfigError(
                    f"Cannot resume the batch sampler: the checkpoint has {key}={state[key]!r} but this run has "
                    f"{key}={mine!r}. Resume with the same seed, data and global batch size (--micro-batch-size x "
                    f"--grad-accum x processes), or start a fresh run.")
        self.epoch = int(state["epoch"])
        self.consumed = int(state["consumed_global_batches"])
        self._resumed = True
