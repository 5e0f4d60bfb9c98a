"""Packing: short rows into full sequences of exactly ``seq_len`` tokens, each row kept apart by its document id.

Short e-commerce rows give a GPU few tokens per step and a CPU a new shape each step. Each row is packed whole and
once; a block-diagonal causal mask and per-row ALiBi positions make a packed row's logits and loss its own.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset as TorchDataset

from ecomkit.data.lengths import (CPU_PACK_MAX_SEQ_LEN, PACK_AUTO_MAX_ROW_SHARE, check_batch_layout,  # noqa: F401
                                  decide_packing, epoch_rng)
from ecomkit.data.tokenize import IGNORE_INDEX, BatchCounts, predicted_tokens
from ecomkit.errors import ConfigError

EMPTY: tuple[int, ...] = ()


def best_fit_decreasing(lengths: Sequence[int], capacity: int, tie_order: np.ndarray | None = None
                        ) -> list[list[int]]:
    """Bins (lists of row indices) of total length ``<= capacity``: best-fit decreasing.

    Longest first (``tie_order`` orders equal lengths) into the fullest bin that holds it; one scan per row.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (lengths.max() > capacity or lengths.min() < 1):
        worst = int(lengths.max()) if lengths.max() > capacity else int(lengths.min())
        raise ConfigError(f"cannot pack a row of {worst} tokens into sequences of {capacity} (--seq-len): rows must "
                          f"be fit to the sequence length before packing (data.tokenize.fit_rows).")
    ties = np.arange(len(lengths)) if tie_order is None else np.asarray(tie_order)
    order = ties[np.argsort(-lengths[ties], kind="stable")]
    bins: list[list[int]] = []
    by_room: list[list[int]] = [[] for _ in range(capacity + 1)]
    has_room = np.zeros(capacity + 1, dtype=bool)
    for row in order.tolist():
        need = int(lengths[row])
        found = int(np.argmax(has_room[need:])) + need if has_room[need:].any() else -1
        if found < 0:
            bins.append([row])
            room = capacity - need
        else:
            b = by_room[found].pop()
            has_room[found] = bool(by_room[found])
            bins[b].append(row)
            room = found - need
            by_room[room].append(b)
            has_room[room] = True
            continue
        by_room[room].append(len(bins) - 1)
        has_room[room] = True
    return bins


def plan_sequences(lengths: Sequence[int], seq_len: int, seed: int, epoch: int) -> list[tuple[int, ...]]:
    """The epoch's packed sequences (row-index tuples) in training order; the same on every rank."""
    rng = epoch_rng(seed, epoch)
    bins = best_fit_decreasing(lengths, seq_len, rng.permutation(len(lengths)))
    return [tuple(bins[i]) for i in rng.permutation(len(bins))]


def fill_rate(lengths: Sequence[int], sequences: Sequence[Sequence[int]], seq_len: int) -> float:
    """Real tokens over positions of packed sequences (empty filler sequences count as positions)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    positions = len(sequences) * seq_len
    return float(sum(int(lengths[list(s)].sum()) for s in sequences if s)) / positions if positions else 0.0


class PackedBatchSampler:
    """A DataLoader ``batch_sampler`` of packed sequences: this rank's micro-batches of one global plan.

    As :class:`~ecomkit.data.sampler.DistributedBatchSampler`, but a sample is a packed sequence; the last global batch
    is topped up with :data:`EMPTY`, so every row is seen exactly once per epoch.
    """

    def __init__(self, lengths: Sequence[int], seq_len: int, micro_batch_size: int, grad_accum: int,
                 num_replicas: int, rank: int, seed: int):
        check_batch_layout(micro_batch_size, grad_accum, num_replicas, rank)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.seq_len, self.micro_batch_size, self.grad_accum = seq_len, micro_batch_size, grad_accum
        self.num_replicas, self.rank, self.seed = num_replicas, rank, seed
        self.per_rank = micro_batch_size * grad_accum
        self.global_batch_size = self.per_rank * num_replicas
        self.epoch, self.consumed, self._resumed = 0, 0, False
        self._plan: tuple[int, list[tuple[int, ...]]] | None = None
        if len(self.lengths) == 0:
            raise ConfigError("The training set has no rows to pack.")

    def sequences(self, epoch: int | None = None) -> list[tuple[int, ...]]:
        """The epoch's sequences, padded with :data:`EMPTY` to whole global batches (planned once per epoch)."""
        epoch = self.epoch if epoch is None else epoch
        if self._plan is None or self._plan[0] != epoch:
            seqs = plan_sequences(self.lengths, self.seq_len, self.seed, epoch)
            seqs += [EMPTY] * ((-len(seqs)) % self.global_batch_size)
            self._plan = (epoch, seqs)
        return self._plan[1]

    @property
    def steps_per_epoch(self) -> int:
        """Global batches (optimizer steps) per epoch: the bins' count is the same every epoch."""
        return len(self.sequences()) // self.global_batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's plan. A new epoch restarts at its first batch; the same epoch keeps a resume point."""
        if epoch != self.epoch:
            self.consumed, self._resumed = 0, False
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[tuple[int, ...]]]:
        seqs = self.sequences()
        n_steps = len(seqs) // self.global_batch_size
        if self.consumed >= n_steps and not self._resumed:
            self.consumed = 0
        self._resumed = False
        mb = self.micro_batch_size
        for step in range(self.consumed, n_steps):
            start = step * self.global_batch_size + self.rank * self.per_rank
            mine = seqs[start:start + self.per_rank]
            for i in range(0, self.per_rank, mb):
                if i + mb >= self.per_rank:
                    self.consumed = step + 1
                yield mine[i:i + mb]

    def __len__(self) -> int:
        return self.steps_per_epoch * self.grad_accum

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed_global_batches": self.consumed, "seed": self.seed,
                "global_batch_size": self.global_batch_size, "num_samples": len(self.lengths),
                "packing": self.seq_len}

    def load_state_dict(self, state: dict) -> None:
        """Continue after ``state["consumed_global_batches"]`` of ``state["epoch"]`` (same data, seed, batch)."""
        for key in ("seed", "global_batch_size", "num_samples", "packing"):
            mine = self.state_dict()[key]
            if state.get(key) != mine:
                raise ConfigError(
                    f"Cannot resume the packed batch sampler: the checkpoint has {key}={state.get(key)!r} but this "
                    f"run has {key}={mine!r}. Resume with the same --seed, data, --seq-len, --packing and global batch "
                    f"size (--micro-batch-size x --grad-accum x processes), or start a fresh run.")
        self.epoch = int(state["epoch"])
        self.consumed = int(state["consumed_global_batches"])
        self._resumed = True


class RowGroups(TorchDataset):
    """A tokenized table indexed by packed sequences: ``groups[(3, 17)]`` is rows 3 and 17 as one column dict."""

    def __init__(self, table):
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, rows: tuple[int, ...]) -> dict[str, list]:
        if not rows:
            return {"input_ids": []}
        return self.table[list(rows)]


def packed_collate(sequences: Sequence[dict[str, list]], seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Lay each sequence's rows end to end in a ``[len(sequences), seq_len]`` batch.

    ``document_ids`` numbers each sequence's rows from 1 (0 = padding); each row's first label is -100, as unpacked.
    """
    n = len(sequences)
    input_ids = torch.full((n, seq_len), pad_id, dtype=torch.long)
    labels = torch.full((n, seq_len), IGNORE_INDEX, dtype=torch.long)
    documents = torch.zeros((n, seq_len), dtype=torch.long)
    polarity: list[int] = []
    for s, columns in enumerate(sequences):
        at = 0
        rows_labels = columns.get("labels", columns["input_ids"])
        for doc, (ids, row_labels) in enumerate(zip(columns["input_ids"], rows_labels), start=1):
            end = at + len(ids)
            if end > seq_len:
                raise ConfigError(f"packed sequence {s} holds {end} tokens, more than --seq-len {seq_len}.")
            input_ids[s, at:end] = torch.as_tensor(ids, dtype=torch.long)
            labels[s, at:end] = torch.as_tensor(row_labels, dtype=torch.long)
            labels[s, at] = IGNORE_INDEX
            documents[s, at:end] = doc
            at = end
        polarity.extend(int(p) for p in columns.get("polarity", ()))
    batch = {"input_ids": input_ids, "attention_mask": (documents > 0).long(), "labels": labels,
             "document_ids": documents}
    if polarity:
        batch["polarity"] = torch.tensor(polarity, dtype=torch.long)
    return batch


def sequence_counts(sequences: Sequence[dict[str, list]], seq_len: int) -> BatchCounts:
    """:class:`~ecomkit.data.tokenize.BatchCounts` of the sequences :func:`packed_collate` lays out."""
    rows = [(ids, labels) for seq in sequences
            for ids, labels in zip(seq["input_ids"], seq.get("labels", seq["input_ids"]))]
    lengths = [len(ids) for ids, _ in rows]
    return BatchCounts(sum(predicted_tokens(labels) for _, labels in rows), sum(lengths), len(rows),
                       len(sequences) * seq_len, sum(n * n for n in lengths))


__all__ = ["sequence_counts", "CPU_PACK_MAX_SEQ_LEN", "PACK_AUTO_MAX_ROW_SHARE", "decide_packing", "EMPTY", "PackedBatchSampler", "RowGroups", "best_fit_decreasing", "fill_rate", "packed_collate",
           "plan_sequences"]
