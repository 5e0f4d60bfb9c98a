"""Chapter 01's roofline: this machine's matmul rate per precision, beside the hardware table's peak on a GPU.

Why a table: a CPU has no data-sheet peak that torch reaches, so its column is measured (``ecomkit.hardware``).
"""

from __future__ import annotations

import torch

from ecomkit.hardware import GEMM_SIZE, PEAK_SIZES, device_peak_flops, matmul_flops, measured_cpu_peak


def peak_table(device: torch.device | str = "cpu", precisions: tuple[str, ...] = ("fp32", "bf16")) -> list[dict]:
    """Chapter 01: per precision, the measured GEMM rate on ``device`` and (GPU) the hardware table's peak."""
    device = torch.device(device)
    rows = []
    for p in precisions:
        table = device_peak_flops(device, p) if device.type == "cuda" else None
        measured = measured_cpu_peak(p) if device.type == "cpu" else matmul_flops(p, device, n=4 * GEMM_SIZE)
        gemm = f"fastest of {'/'.join(map(str, PEAK_SIZES))}²" if device.type == "cpu" else f"{4 * GEMM_SIZE}²"
        rows.append({"precision": p, "measured_flops_per_s": measured, "table_flops_per_s": table,
                     "threads": torch.get_num_threads(), "gemm": gemm})
    return rows


__all__ = ["peak_table"]
