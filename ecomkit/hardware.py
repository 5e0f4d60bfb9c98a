"""FLOPs per token and device peaks, for MFU and for the time planner.

Training FLOPs per token ≈ 6Ψ (forward 2Ψ + backward 4Ψ, every weight is one
multiply-add per token) plus the attention score/value products that do not
involve weights: 12 · n_layer · hidden · seq_len (PaLM appendix B). Ψ counts
every parameter once, embeddings included, as nanoGPT does; the LM head
shares the embedding weight in BLOOM but still does its 2·V·h matmul, which
6Ψ already counts.
"""

from __future__ import annotations

import torch

# Dense peak TFLOP/s by precision (no sparsity), from the vendors' data sheets.
GPU_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "H100": {"bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
    "A10": {"bf16": 125.0, "fp16": 125.0, "fp32": 31.2},
    "L40S": {"bf16": 362.0, "fp16": 362.0, "fp32": 91.6},
    "4090": {"bf16": 165.2, "fp16": 165.2, "fp32": 82.6},
    "V100": {"bf16": 0.0, "fp16": 125.0, "fp32": 15.7},
}


def flops_per_token(n_params: int, n_layer: int, hidden: int, seq_len: int) -> float:
    """Training FLOPs per token: 6Ψ + 12·L·h·T."""
    return 6.0 * n_params + 12.0 * n_layer * hidden * seq_len


def device_peak_flops(device: torch.device, precision: str) -> float | None:
    """Peak FLOP/s of one device for ``precision``; ``None`` when unknown (e.g. CPU)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for key, peaks in GPU_PEAK_TFLOPS.items():
        if key in name and peaks.get(precision):
            return peaks[precision] * 1e12
    return None
