"""The training batches of a run: length-bucketed rows or packed sequences, and what each batch counts.

Why a module of its own: the loop must not care which of the two it trains
on. :func:`training_loader` builds the sampler and loader for either
(``ecomkit.data.sampler`` / ``ecomkit.data.packing``), whose batches come with
their counts (label tokens, real tokens, rows, positions, Σ L²) taken from the
rows on the host (:class:`Counted`), so reading them never waits for a device.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np
from torch.utils.data import DataLoader

from ecomkit.config import TrainConfig
from ecomkit.dist import log
from ecomkit.data import DistributedBatchSampler, pad_collate
from ecomkit.data.lengths import generation_budget
from ecomkit.data.packing import PackedBatchSampler, RowGroups, decide_packing, packed_collate, sequence_counts
from ecomkit.data.tokenize import row_counts


def resolve_data_settings(cfg: TrainConfig, report, lengths: np.ndarray, device_type: str) -> tuple[bool, str, str]:
    """Set ``cfg.seq_len`` and ``cfg.gen_max_new_tokens`` from the data; return (packed, why, budget's why).

    ``report``: the data's :class:`~ecomkit.data.build.BuildReport` (its ``seq_len`` is ``--seq-len auto``'s
    choice); ``lengths``: the training rows as fit; ``device_type``: where the run trains (``--packing auto``'s
    CPU rule). The budget is set for task ``nlu`` only.
    """
    cfg.seq_len = report.seq_len
    budget_why = ""
    if cfg.task == "nlu":   # --gen-max-new-tokens auto: the longest training answer + 8
        cfg.gen_max_new_tokens, budget_why = generation_budget(cfg.gen_max_new_tokens, report.lengths["train"])
    packed, why = decide_packing(cfg.packing, float(lengths.mean()), cfg.seq_len, device_type, cfg.precision)
    return packed, why, budget_why


class Counted:
    """A collate function that also counts its batch on the host: ``(batch, BatchCounts)``.

    Why: the loop needs each micro-batch's token and row counts (the loss scale's label tokens, throughput,
    MFU). Read from the collated tensors they cost a host read each; counted from the rows before they
    become tensors they cost nothing on the device, so a step needs no synchronisation for them. A padded
    batch also says whether it has padding (``has_padding``), for ``models.attention.attention_mask_for``,
    and every batch how many positions its loss reads (``label_count``), so the chunked loss selects them
    without a data-dependent shape (``models.loss.chunked_token_loss_sum``).
    """

    def __init__(self, collate: Callable, count: Callable):
        self.collate, self.count = collate, count

    def __call__(self, features):
        batch, counts = self.collate(features), self.count(features)
        if "document_ids" not in batch:   # whether the rows were padded: the model's mask plan, known without a read
            batch["has_padding"] = counts.tokens < counts.positions
        batch["label_count"] = counts.label_tokens
        return batch, counts


def log_data_choices(run) -> None:
    """Rank 0's account of the data: the build summary, cut warnings, and the packing and budget decisions."""
    log.info("data: %s", run.data_report.summary())
    for warning in [*run.data_report.cut_warnings(), *run.data_report.warnings()]:
        log.warning(warning)   # inputs cut by more than half; labels that never occur, rows with no label
    log.info("packing %s", run.packing_reason)
    if run.cfg.task == "nlu":
        log.info("generation budget %d tokens (%s)", run.cfg.gen_max_new_tokens, run.gen_budget_reason)


def training_loader(train_ds, lengths: np.ndarray, cfg: TrainConfig, shard: tuple[int, int], grad_accum: int,
                    packed: bool, pad_id: int, multiple: int | None, pin_memory: bool = False
                    ) -> tuple[DistributedBatchSampler | PackedBatchSampler, DataLoader]:
    """``(sampler, loader)``: micro-batches of packed sequences of ``cfg.seq_len`` tokens, or of bucketed rows.

    The loader yields ``(batch, counts)`` (:class:`Counted`). ``shard``: (index, count) of this rank's data
    shard; ``multiple``: what padded lengths round up to (``train/shapes.py``; packed sequences are
    ``seq_len`` long already); ``pin_memory``: batches in page-locked memory, so the copy to a GPU does not
    make the host wait.
    """
    if packed:   # one shape every step: micro_batch_size sequences of exactly seq_len tokens
        sampler = PackedBatchSampler(lengths, cfg.seq_len, cfg.micro_batch_size, grad_accum, num_replicas=shard[1],
                                     rank=shard[0], seed=cfg.seed)
        collate = Counted(functools.partial(packed_collate, seq_len=cfg.seq_len, pad_id=pad_id),
                          functools.partial(sequence_counts, seq_len=cfg.seq_len))
        return sampler, DataLoader(RowGroups(train_ds), batch_sampler=sampler, collate_fn=collate,
                                   pin_memory=pin_memory)
    sampler = DistributedBatchSampler(lengths, micro_batch_size=cfg.micro_batch_size, grad_accum=grad_accum,
                                      num_replicas=shard[1], rank=shard[0], seed=cfg.seed, bucketed=cfg.bucketed)
    collate = Counted(functools.partial(pad_collate, pad_id=pad_id, pad_to_multiple_of=multiple),
                      functools.partial(row_counts, pad_to_multiple_of=multiple))
    return sampler, DataLoader(train_ds, batch_sampler=sampler, collate_fn=collate, pin_memory=pin_memory)


__all__ = ["Counted", "log_data_choices", "resolve_data_settings", "training_loader"]
