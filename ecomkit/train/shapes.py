"""Batch lengths rounded up to a multiple of 16 under CPU autocast, so a bf16 run's memory plateaus.

Why: oneDNN, which runs torch's bf16 matmuls on CPU, builds and caches one
primitive per distinct shape, and the C heap keeps the buffers of every size
it has seen. Length-bucketed batches have a new length almost every step, so
under bf16 autocast on CPU peak RSS grew by ~2.7 MB per step on the tiny
preset (~20 MB on ``small``), without bound, while fp32 plateaued. Rounding
the padded length up to a multiple of 16 leaves at most ``seq_len / 16``
shapes, and the growth stops (docs/perf.md, "bf16 on CPU: memory", has the
measurements and the candidates ruled out). The chunked loss rounds the LM
head's row count (the labeled positions) up for the same reason, to a multiple
of 16 and of an eighth of the count's power of two
(``ecomkit.models.loss.head_rows``): packed sequences' label counts spread too
widely for multiples of 16 alone.

The cost is padding: at most 15 positions per batch, which the throughput
figures count as padding, not as tokens. fp32 on CPU and every GPU run keep
the exact batch length (no growth was seen there; fp32 chapters keep their
bit-level comparisons on unchanged batches).
"""

from __future__ import annotations

import torch

# Measured on the tiny preset, 150 bf16 steps on varied lengths: peak RSS step 150 / step 50 was 1.25
# with exact lengths, 1.07 with multiples of 16, 1.05 with multiples of 32 (fp32, exact lengths: 1.05-1.10).
CPU_AUTOCAST_LENGTH_MULTIPLE = 16


def length_multiple(precision: str, device: torch.device) -> int | None:
    """What to round batch lengths up to: 16 under autocast (bf16/fp16) on CPU, else None (exact lengths)."""
    if device.type == "cpu" and precision in ("bf16", "fp16"):
        return CPU_AUTOCAST_LENGTH_MULTIPLE
    return None


__all__ = ["CPU_AUTOCAST_LENGTH_MULTIPLE", "length_multiple"]
