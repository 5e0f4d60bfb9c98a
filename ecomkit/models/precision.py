"""Autocast, loss scaling and batch shapes per precision, on whatever device we run.

fp16 needs loss scaling (gradients underflow), bf16 does not. Under CPU autocast batch lengths round up to a
multiple of 16: oneDNN caches a primitive per shape, and peak RSS grew without bound on varied lengths.
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


CPU_AUTOCAST_LENGTH_MULTIPLE = 16


def length_multiple(precision: str, device: torch.device) -> int | None:
    """What to round batch lengths up to: 16 under autocast (bf16/fp16) on CPU, else None (exact lengths)."""
    if device.type == "cpu" and precision in ("bf16", "fp16"):
        return CPU_AUTOCAST_LENGTH_MULTIPLE
    return None
