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
