"""Length-bucketed, distributed batch sampling planned as *global* batches.

Why global batches: every rank computes the same list of global batches from
``(seed, epoch)`` alone and takes a contiguous slice of each. Consequences the
training loop relies on:

- one optimizer step consumes exactly one global batch, whatever the number of
  processes: a 1-process run with ``grad_accum=4`` and a 2-process run with
  ``grad_accum=2`` (same micro-batch) see the *same samples* at every step, so
  their loss curves can be compared directly;
- ranks never overlap (disjoint slices) and need no communication to agree;
- a checkpoint only has to store ``(epoch, global batches consumed)``; it can
  even be resumed on a different number of processes, as long as the global
  batch size is unchanged.

Why buckets: padding every micro-batch to its longest sequence wastes compute
on pad tokens. Sorting a *mega-chunk* (here 64 global batches) by length and
cutting it into global batches makes neighbours similar in length, while the
final shuffle of the batch order keeps the training signal random. Sorting the
whole epoch instead would make the model see all short samples first.

Why ranks do not wait on each other: every step ends at an all-reduce, so
the rank with the longest sequences sets the pace. Because buckets are cut
as *global* batches, all ranks of one step draw from the same length bucket
(the step's samples are one contiguous run of a length-sorted chunk, rank r
taking the r-th part), so no rank gets a long bucket while another gets a
short one. What remains is the spread inside one bucket;
:func:`ecomkit.data.padding.compare_rank_wait` computes the waiting from the
plan, and ``benchmarks/bench_padding.py`` prints it next to random batching.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from ecomkit.errors import ConfigError

CHUNK_GLOBAL_BATCHES = 64


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The random stream of one epoch's plan: identical on every rank for the same ``(seed, epoch)``."""
    # numpy's PCG64 stream is identical on every platform, so all ranks agree.
    return np.random.default_rng([int(seed), int(epoch)])


def plan_global_batches(lengths: Sequence[int], global_batch_size: int, seed: int, epoch: int,
                        bucketed: bool = True, drop_last: bool = True,
                        chunk_batches: int = CHUNK_GLOBAL_BATCHES) -> list[list[int]]:
    """Return the epoch's global batches (lists of sample indices), identical for identical arguments.

    ``bucketed``: shuffle, split into mega-chunks of ``chunk_batches`` global
    batches, sort each chunk by length (stable), cut into global batches,
    shuffle the batch order. Otherwise: a plain shuffle cut into batches.
    ``drop_last=True`` drops the ``len % global_batch_size`` leftover samples
    (a different random set each epoch); ``drop_last=False`` keeps them as one
    final, smaller batch, always last.
    """
    full, partial = plan_arrays(lengths, global_batch_size, seed, epoch, bucketed, drop_last, chunk_batches)
    return full.tolist() + ([partial.tolist()] if len(partial) else [])


def plan_arrays(lengths: Sequence[int], global_batch_size: int, seed: int, epoch: int, bucketed: bool = True,
                drop_last: bool = True, chunk_batches: int = CHUNK_GLOBAL_BATCHES) -> tuple[np.ndarray, np.ndarray]:
    """The plan of :func:`plan_global_batches` as arrays: full batches ``[n_full, global_batch_size]`` and the
    leftover (empty with ``drop_last``).

    Vectorised (one ``lexsort`` sorts every chunk by length), so a 10 M-row
    epoch is planned in seconds and held as 80 MB of int64 rather than as
    10 M Python ints; the sampler converts one global batch at a time.
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


def check_batch_layout(micro_batch_size: int, grad_accum: int, num_replicas: int, rank: int) -> None:
    """The sizes a sampler cuts global batches by: each at least 1, and ``rank`` one of the replicas."""
    for flag, value in (("--micro-batch-size", micro_batch_size), ("--grad-accum", grad_accum),
                        ("the number of data-parallel processes", num_replicas)):
        if value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}.")
    if not 0 <= rank < num_replicas:
        raise ConfigError(f"rank must be in 0..{num_replicas - 1}, got {rank}.")


class DistributedBatchSampler:
    """A DataLoader ``batch_sampler`` yielding this rank's micro-batches of one global plan.

    Global batch = ``micro_batch_size * grad_accum * num_replicas`` samples.
    For each global batch the rank takes ``global[rank*per_rank:(rank+1)*per_rank]``
    (``per_rank = micro_batch_size * grad_accum``) and yields it as
    ``grad_accum`` consecutive micro-batches. In a bucketed plan the global
    batch is sorted by length, so each micro-batch holds neighbours in length.

    Coverage mode (``drop_last=False``): the final, smaller global batch is
    split as evenly as possible across ranks (contiguous parts whose sizes
    differ by at most one; ``numpy.array_split``), and each part is cut into
    micro-batches of at most ``micro_batch_size``. A rank may then get fewer
    than ``grad_accum`` micro-batches, or none if the final batch holds fewer
    samples than there are ranks. Every sample is seen exactly once per epoch,
    which is what evaluation needs; for training keep ``drop_last=True`` so
    every step has a full, equal-sized global batch on every rank.

    Resuming: ``state_dict()`` stores the epoch and the number of global
    batches consumed; ``load_state_dict`` makes the next iteration continue
    after them. The counter advances when the last micro-batch of a global
    batch is handed out, which matches the training step with
    ``num_workers=0``; with worker processes the DataLoader prefetches, so
    build the state from the training loop's own step count instead:
    ``{"epoch": e, "consumed_global_batches": steps_done_in_epoch, ...}``.
    """

    def __init__(self, lengths: Sequence[int], micro_batch_size: int, grad_accum: int, num_replicas: int,
                 rank: int, seed: int, bucketed: bool = True, drop_last: bool = True,
                 chunk_batches: int = CHUNK_GLOBAL_BATCHES):
        check_batch_layout(micro_batch_size, grad_accum, num_replicas, rank)
        self.lengths = np.asarray(lengths)   # any integer dtype: int32 from an Arrow table is kept as is
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
        """This rank's micro-batches of one global batch (see the class docstring for the last batch)."""
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

        The plan depends on the seed, the global batch size, the number of
        samples and the batching mode, so those must match; the number of
        processes may differ.
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
