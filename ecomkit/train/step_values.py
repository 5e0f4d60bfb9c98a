"""A training step's values that stay on the device until the log interval reads them all at once.

Why: every ``float(tensor)`` of a CUDA tensor makes the host wait for the GPU to
finish everything queued before it, so the next step's kernels are not queued
in time and the GPU idles. A step keeps its loss sum, its global label-token
count and its gradient norm as tensors (:class:`StepTensors`); the loop reads a
log interval's worth with :func:`read_scalars`, one wait per interval
(``--log-interval``). tests/test_step_syncs.py counts the reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch


@dataclass
class StepTensors:
    """One step's values not yet read: device tensors, or numbers a strategy already had on the host."""

    loss_sum: torch.Tensor | float      # this rank's token-loss sum (all-reduced at the read)
    label_tokens: torch.Tensor | float  # the global batch's label tokens (already all-reduced: the loss scale's)
    grad_norm: torch.Tensor | float     # the global gradient norm, as the strategy computed it
    skipped: Any                         # fp16: the loss scaler skipped the step
    counts: Sequence[int]                # this rank's tokens, rows, positions, Σ L² (host numbers)


def read_scalars(values: Sequence[torch.Tensor | float]) -> list[float]:
    """Python floats of 0-d tensors and numbers, reading the device once (one stack, one ``tolist``)."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return [float(v) for v in values]
    device = tensors[0].device
    read = iter(torch.stack([v.detach().reshape(()).to(device, torch.float64) for v in tensors]).tolist())
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]


__all__ = ["StepTensors", "read_scalars"]
