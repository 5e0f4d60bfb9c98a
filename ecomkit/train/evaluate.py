"""Evaluation: the held-out loss, each rank on a disjoint share with the same number of forwards (collectives).

Why the answer positions only: the loss reads the logits that predict a label, so the others are never computed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ecomkit.data import lengths_array
from ecomkit.data.tokenize import IGNORE_INDEX
from ecomkit.dist import DistEnv
from ecomkit.models.loss import count_label_tokens


def shard_range(n: int, index: int, count: int) -> tuple[int, int]:
    """``[start, end)`` of shard ``index`` of ``count`` over ``n`` items: contiguous, sizes differ by at most one."""
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def all_reduce_sums(values: list[float], env: DistEnv) -> list[float]:
    """Element-wise sums over all ranks in float64 (counts stay exact up to 2**53): one collective, several numbers."""
    if not env.distributed:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=env.device if env.backend == "nccl" else "cpu")
    dist.all_reduce(t)
    return t.tolist()


@torch.no_grad()
def evaluate_loss(strategy, eval_ds, collate, env: DistEnv, micro_batch_size: int, n_batches: int | None,
                  shard: tuple[int, int] | None = None) -> float:
    """Mean next-token loss over the held-out examples (global token mean); see :func:`held_out_loss`."""
    return held_out_loss(strategy, eval_ds, collate, env, micro_batch_size, n_batches, shard)["eval_loss"]


@torch.no_grad()
def held_out_loss(strategy, eval_ds, collate, env: DistEnv, micro_batch_size: int, n_batches: int | None,
                  shard: tuple[int, int] | None = None, max_examples: int | None = None,
                  bar: Any = None) -> dict[str, float]:
    """``eval_loss`` (global token mean), and the ``eval_loss_examples`` and ``eval_loss_tokens`` it rests on.
    ``n_batches``: micro-batches per data shard, None for every example (or the first ``max_examples``); ranks of
    one shard (TP/PP) evaluate the same slice, and the replication cancels in the ratio of sums."""
    idx, n_shards = shard or (env.rank, env.world_size)
    n = min(len(eval_ds), max_examples or len(eval_ds)) if n_batches is None else min(
        len(eval_ds), n_batches * micro_batch_size * n_shards)
    start, end = shard_range(n, idx, n_shards)
    order = by_length(eval_ds, start, end)                 # similar lengths share a batch: less padding
    steps = -(-(-(-n // n_shards)) // micro_batch_size)   # batches of the largest share: every rank runs them
    sums = [0.0, 0.0, 0.0]                                 # loss, label tokens, examples
    model = strategy.model
    was_training = model.training
    model.eval()
    for step in range(steps):
        rows = order[step * micro_batch_size:(step + 1) * micro_batch_size]
        batch = collate([eval_ds[j] for j in (rows or [0])])   # a share one short repeats a row, not counted
        batch = {k: v.to(env.device) for k, v in batch.items()}
        positions = answer_positions(batch["labels"])
        logits = strategy.forward_logits(batch["input_ids"], batch["attention_mask"], positions)
        if rows:
            sums = [sums[0] + float(kept_loss_sum(logits, batch["labels"], positions)),
                    sums[1] + count_label_tokens(batch["labels"]), sums[2] + len(rows)]
            if bar is not None:
                bar.update(len(rows))
    model.train(was_training)
    total_loss, total_tokens, examples = all_reduce_sums(sums, env)
    replication = env.world_size // n_shards   # TP/PP ranks of one shard evaluate the same rows
    return {"eval_loss": total_loss / max(total_tokens, 1.0), "eval_loss_examples": round(examples / replication),
            "eval_loss_tokens": round(total_tokens / replication)}


def by_length(eval_ds, start: int, end: int) -> list[int]:
    """Rows ``start..end-1`` shortest first (the ``length`` column of a tokenized table, else each row's ids)."""
    if "length" in getattr(eval_ds, "column_names", ()):
        lengths = lengths_array(eval_ds)[start:end].tolist()
    else:
        lengths = [len(eval_ds[j]["input_ids"]) for j in range(start, end)]
    return [start + i for i in sorted(range(end - start), key=lengths.__getitem__)]


def answer_positions(labels: torch.Tensor) -> torch.Tensor:
    """The positions whose logits predict a label (``t`` where ``labels[:, t + 1]`` is set), over every row; never
    empty (a batch without labels keeps 0)."""
    cols = (labels[:, 1:] != IGNORE_INDEX).any(0).nonzero().flatten()
    return cols if len(cols) else torch.zeros(1, dtype=torch.long, device=labels.device)


def kept_loss_sum(logits: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Σ next-token losses from the logits of ``positions`` only (``[B, len(positions), V]``): as
    :func:`ecomkit.models.loss.token_loss_sum` on the full logits, which reads no other position."""
    targets = labels[:, positions + 1]
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


__all__ = ["all_reduce_sums", "answer_positions", "by_length", "evaluate_loss", "held_out_loss", "kept_loss_sum",
           "shard_range"]
