"""Which precision a run computes in (``--precision auto``), and its autocast, loss scaling and batch shapes.

Why batch shapes: under CPU autocast oneDNN caches a primitive per shape (docs/perf.md measures the memory it holds).
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

from ecomkit.hardware import DTYPES, NO_BF16_UNITS, cpu_bf16_units, measured_cpu_peak

AUTO_BF16_MIN_SPEEDUP = 1.5  # "clearly faster": autocast adds casts, so a marginal GEMM gain would not pay
CPU_AUTOCAST_LENGTH_MULTIPLE = 16


def choose_precision(device: torch.device, rates: dict[str, float] | None = None) -> tuple[str, str]:
    """``--precision auto``: (``"bf16"`` or ``"fp32"``, why). ``rates`` replaces the CPU probe (tests).

    Why timed on a CPU: bf16 pays only on cores with bf16 units; one without them gets fp32 untimed (emulated bf16).
    """
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", f"{torch.cuda.get_device_name(device)} supports bf16"
        return "fp32", f"{torch.cuda.get_device_name(device)} has no bf16 support"
    if device.type != "cpu":
        return "fp32", f"no bf16 probe for device type '{device.type}'"
    if rates is None and cpu_bf16_units() is False:
        return "fp32", (f"this CPU has {NO_BF16_UNITS} in /proc/cpuinfo: a bf16 GEMM would run converted, "
                        "many times slower than fp32 (not timed)")
    rates = rates or {p: measured_cpu_peak(p) for p in ("fp32", "bf16")}
    speedup = rates["bf16"] / rates["fp32"]
    measured = (f"bf16 GEMM {rates['bf16'] / 1e9:.3g} GFLOP/s vs fp32 {rates['fp32'] / 1e9:.3g} GFLOP/s "
                f"({speedup:.2f}x, {torch.get_num_threads()} thread(s))")
    if speedup >= AUTO_BF16_MIN_SPEEDUP:
        return "bf16", f"{measured} >= {AUTO_BF16_MIN_SPEEDUP}x"
    return "fp32", f"{measured} < {AUTO_BF16_MIN_SPEEDUP}x: this CPU does not multiply faster in bf16"


def autocast_context(precision: str, device: torch.device) -> ContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[precision])


def build_grad_scaler(precision: str, device: torch.device) -> "torch.amp.GradScaler | None":
    """Dynamic loss scaling for fp16; ``None`` otherwise."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(device.type)


def length_multiple(precision: str, device: torch.device) -> int | None:
    """What to round batch lengths up to: 16 under autocast (bf16/fp16) on CPU, else None (exact lengths)."""
    if device.type == "cpu" and precision in ("bf16", "fp16"):
        return CPU_AUTOCAST_LENGTH_MULTIPLE
    return None
