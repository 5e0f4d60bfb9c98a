"""The training batches of a run: length-bucketed rows or packed sequences, and what each batch counts.

Why a module of its own: the loop must not care which of the two it trains
on. :func:`training_loader` builds the sampler and loader for either
(``ecomkit.data.sampler`` / ``ecomkit.data.packing``), and :func:`batch_counts`
counts a micro-batch's real tokens, rows, positions and Σ L² the same way for
both, on the host, before the batch is copied to the device.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.utils.data import DataLoader

from ecomkit.config import TrainConfig
from ecomkit.data import DistributedBatchSampler, pad_collate
from ecomkit.data.lengths import generation_budget
from ecomkit.data.packing import PackedBatchSampler, RowGroups, decide_packing, packed_collate


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


def training_loader(train_ds, lengths: np.ndarray, cfg: TrainConfig, shard: tuple[int, int], grad_accum: int,
                    packed: bool, pad_id: int, multiple: int | None
                    ) -> tuple[DistributedBatchSampler | PackedBatchSampler, DataLoader]:
    """``(sampler, loader)``: micro-batches of packed sequences of ``cfg.seq_len`` tokens, or of bucketed rows.

    ``shard``: (index, count) of this rank's data shard; ``multiple``: what padded lengths round up to
    (``train/shapes.py``; packed sequences are ``seq_len`` long already).
    """
    if packed:   # one shape every step: micro_batch_size sequences of exactly seq_len tokens
        sampler = PackedBatchSampler(lengths, cfg.seq_len, cfg.micro_batch_size, grad_accum, num_replicas=shard[1],
                                     rank=shard[0], seed=cfg.seed)
        collate = functools.partial(packed_collate, seq_len=cfg.seq_len, pad_id=pad_id)
        return sampler, DataLoader(RowGroups(train_ds), batch_sampler=sampler, collate_fn=collate)
    sampler = DistributedBatchSampler(lengths, micro_batch_size=cfg.micro_batch_size, grad_accum=grad_accum,
                                      num_replicas=shard[1], rank=shard[0], seed=cfg.seed, bucketed=cfg.bucketed)
    collate = functools.partial(pad_collate, pad_id=pad_id, pad_to_multiple_of=multiple)
    return sampler, DataLoader(train_ds, batch_sampler=sampler, collate_fn=collate)


def batch_counts(batch: dict[str, torch.Tensor]) -> tuple[int, int, int, int]:
    """(real tokens, rows, positions, Σ L² over rows) of one micro-batch, packed or padded.

    A packed batch's rows are its documents (``document_ids`` 1, 2, ...; 0 is padding), so throughput counts
    rows and the MFU's attention term their own lengths, never the sequence they share.
    """
    real = int(batch["attention_mask"].sum())
    if "document_ids" not in batch:
        lengths = batch["attention_mask"].sum(dim=1)
        return real, batch["input_ids"].size(0), batch["input_ids"].numel(), int((lengths ** 2).sum())
    docs = batch["document_ids"]
    per_doc = torch.zeros(docs.shape[0], int(docs.max()) + 1, dtype=torch.long).scatter_add_(
        1, docs, torch.ones_like(docs))[:, 1:]
    return real, int((per_doc > 0).sum()), docs.numel(), int((per_doc ** 2).sum())


__all__ = ["batch_counts", "resolve_data_settings", "training_loader"]
