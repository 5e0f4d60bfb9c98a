"""Token-level loss sums, so the loop can normalise by the *global* token count.

Why sums and not ``model(..., labels=...).loss``: the model's mean is over the
micro-batch's tokens, so averaging micro-batch means weights short and long
batches equally, and 1-process vs 2-process vs accumulation runs stop being
comparable. Summing here and dividing once by the global batch's label-token
count makes every split of the same global batch produce the same gradient.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def shifted_token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-position next-token losses ``[B, T-1]`` (0 where labels are -100)."""
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    losses = F.cross_entropy(shift_logits.reshape(-1, shift_logits.size(-1)), shift_labels.reshape(-1),
                             ignore_index=-100, reduction="none")
    return losses.view(shift_labels.shape)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return shifted_token_losses(logits, labels).sum()


def count_label_tokens(labels: torch.Tensor) -> int:
    """Positions that contribute to the loss after the causal shift."""
    return int((labels[:, 1:] != -100).sum())


def chunked_token_loss_sum(hidden: torch.Tensor, head: torch.nn.Module, labels: torch.Tensor,
                           chunk_tokens: int) -> torch.Tensor:
    """:func:`token_loss_sum` from the last hidden state, never holding the ``[B, T, vocab]`` logits.

    Why: at long sequences the LM head's logits, their fp32 log-softmax and
    the gradients of both are the biggest tensors of a training step (each
    ``B × T × vocab`` floats; BLOOM's vocabulary is 250,880). This keeps only
    the positions that have a label (NLU answers are a small part of each
    sequence), then computes head + cross-entropy ``chunk_tokens`` positions
    at a time under activation checkpointing: the forward keeps no logits and
    the backward recomputes one chunk's logits at a time. The cost is one
    extra head matmul per chunk in backward; when everything fits in one
    chunk nothing is recomputed.

    Equal to ``token_loss_sum(head(hidden), labels)`` up to the order of the
    floating-point sum (tested). ``head`` is called as a module, so wrappers'
    hooks on it (FSDP2 unsharding, autocast) still run.
    """
    from torch.utils.checkpoint import checkpoint

    flat_h = hidden[:, :-1].reshape(-1, hidden.size(-1))
    flat_y = labels[:, 1:].reshape(-1)
    keep = (flat_y != -100).nonzero().squeeze(1)
    if keep.numel() == 0:  # no label in this micro-batch: a zero that still reaches every parameter
        return F.cross_entropy(head(flat_h[:1]).float(), flat_y[:1].clamp(min=0), reduction="sum") * 0.0
    h, y = flat_h.index_select(0, keep), flat_y.index_select(0, keep)
    if y.numel() <= chunk_tokens:
        return _head_loss_sum(head, h, y)
    total = h.new_zeros((), dtype=torch.float32)
    for start in range(0, y.numel(), chunk_tokens):
        part = slice(start, start + chunk_tokens)
        total = total + checkpoint(_head_loss_sum, head, h[part], y[part], use_reentrant=False)
    return total


def _head_loss_sum(head: torch.nn.Module, h: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(h).float(), y, reduction="sum")
