"""Packed against unpacked: the same rows' loss and gradients both ways, and what one row does to another.

Chapter 02 and ``tests/test_packing.py`` check with these functions that packing
(:mod:`ecomkit.data.packing`) changes how rows are laid out and nothing else:

- :func:`packing_agreement`: the token-loss sum and every parameter's gradient
  of the same rows, packed into sequences under their document mask and padded
  one per row, as relative differences (fp32: float rounding, ~1e-7);
- :func:`row_isolation`: after changing one packed row's tokens, whether any
  other row's logits moved (they must not, bit for bit).

:func:`seed_spread` and :func:`equal_step_micro_batch` give ``bench_packing``'s loss verdict: packed and bucketed
runs with about the same tokens per step, their final losses equal within the seeds' spread.
``--packing auto``'s CPU rule is derived from a ``bench_packing`` artifact in :mod:`ecomlab.derive.packing`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ecomkit.data.packing import best_fit_decreasing, packed_collate
from ecomkit.data.tokenize import IGNORE_INDEX, pad_collate
from ecomkit.models.attention import attention_mask_for
from ecomkit.models.loss import TokenLoss, lm_loss_sum


def random_rows(n: int, vocab: int, seed: int = 0, prompted: bool = False, shortest: int = 4,
                longest: int = 40) -> list[dict[str, list[int]]]:
    """``n`` rows of random tokens: LM rows (labels = ids), or with a prompt half (labels -100 on it)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(shortest, longest, (1,), generator=g))
        ids = torch.randint(4, vocab, (length,), generator=g).tolist()
        labels = list(ids)
        if prompted:
            labels[:length // 2] = [IGNORE_INDEX] * (length // 2)
        out.append({"input_ids": ids, "labels": labels})
    return out


def packed_batch(rows: list[dict], seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """The rows packed by best-fit decreasing into sequences of ``seq_len``, as the training loop collates them."""
    bins = best_fit_decreasing([len(r["input_ids"]) for r in rows], seq_len)
    return packed_collate([{"input_ids": [rows[i]["input_ids"] for i in b], "labels": [rows[i]["labels"] for i in b]}
                           for b in bins], seq_len, pad_id)


def padded_batch(rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """The same rows one per row, right-padded (the unpacked layout)."""
    return pad_collate(rows, pad_id)


def loss_and_gradients(model: nn.Module, batch: dict[str, torch.Tensor], loss_fn: TokenLoss = TokenLoss()
                       ) -> tuple[float, dict[str, torch.Tensor]]:
    """Σ token losses of ``batch`` through ``loss_fn`` (default: the full logits) and a copy of every gradient."""
    model.zero_grad(set_to_none=True)
    loss = lm_loss_sum(model, loss_fn, batch["input_ids"], attention_mask_for(batch), batch["labels"])
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


@dataclass(frozen=True)
class PackingAgreement:
    """How far the packed loss and gradients are from the unpacked ones (relative), and the layouts' sizes."""

    loss_packed: float
    loss_unpacked: float
    loss_rel: float
    grad_rel: float          # the largest over parameters of |g_packed - g_unpacked| / |g_unpacked|
    sequences: int           # packed sequences the rows took
    rows: int

    def within(self, rel: float) -> bool:
        return self.loss_rel <= rel and self.grad_rel <= rel


def packing_agreement(model: nn.Module, rows: list[dict], seq_len: int, pad_id: int,
                      loss_fn: TokenLoss = TokenLoss()) -> PackingAgreement:
    """:class:`PackingAgreement` of ``rows`` on ``model`` (its attention as installed) through ``loss_fn``."""
    packed = packed_batch(rows, seq_len, pad_id)
    loss_p, grads_p = loss_and_gradients(model, packed, loss_fn)
    loss_u, grads_u = loss_and_gradients(model, padded_batch(rows, pad_id), loss_fn)
    worst = max(float((grads_p[k] - g).norm() / g.norm().clamp(min=1e-30)) for k, g in grads_u.items())
    return PackingAgreement(loss_p, loss_u, abs(loss_p - loss_u) / abs(loss_u), worst, packed["input_ids"].shape[0],
                            len(rows))


@torch.no_grad()
def row_isolation(model: nn.Module, rows: list[dict], seq_len: int, pad_id: int, vocab: int,
                  seed: int = 0) -> tuple[bool, bool]:
    """Change the second row of the first packed sequence: (its own logits changed, every other row's stayed)."""
    batch = packed_batch(rows, seq_len, pad_id)
    docs = batch["document_ids"]
    before = model(input_ids=batch["input_ids"], attention_mask=attention_mask_for(batch)).logits
    target = docs == 2
    target[1:] = False
    changed = batch["input_ids"].clone()
    g = torch.Generator().manual_seed(seed)
    changed[target] = torch.randint(4, vocab, (int(target.sum()),), generator=g)
    after = model(input_ids=changed, attention_mask=attention_mask_for(batch)).logits
    return not torch.equal(before[target], after[target]), torch.equal(before[~target], after[~target])


@dataclass(frozen=True)
class SeedSpread:
    """Two variants' final losses over the same seeds: the gap of their medians against the seeds' spread."""

    gap: float      # |median(a) - median(b)|
    noise: float    # the larger of the two variants' spreads (max - min over seeds)

    @property
    def within_noise(self) -> bool:
        return self.gap <= self.noise


def seed_spread(a: list[float], b: list[float]) -> SeedSpread:
    """Whether ``b``'s losses equal ``a``'s within what changing the seed alone moves either (>= 2 seeds each)."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("the seeds' spread needs at least two seeds per variant")
    return SeedSpread(abs(float(np.median(a)) - float(np.median(b))), max(max(a) - min(a), max(b) - min(b)))


def equal_step_micro_batch(micro_batch: int, packed_steps: int, bucketed_steps: int) -> int:
    """Packed sequences per micro-batch that give about the bucketed run's steps per epoch (at least 1).

    At ``micro_batch`` sequences an epoch takes ``packed_steps``; sequences per step scale inversely with steps.
    """
    return max(1, round(micro_batch * packed_steps / bucketed_steps))


__all__ = ["SeedSpread", "seed_spread", "equal_step_micro_batch", "PackingAgreement", "loss_and_gradients", "packed_batch", "packing_agreement", "padded_batch",
           "random_rows", "row_isolation"]
