"""Autocast and loss scaling per precision, on whatever device we run.

bf16 has fp32's exponent range, so it needs no loss scaling; fp16 does
(gradients underflow), hence :func:`build_grad_scaler`. On CPU, autocast
supports bf16 (and fp16 on recent torch); fp32 runs without autocast.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_context(precision: str, device: torch.device) -> ContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def build_grad_scaler(precision: str, device: torch.device) -> "torch.amp.GradScaler | None":
    """Dynamic loss scaling for fp16; ``None`` otherwise."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)
