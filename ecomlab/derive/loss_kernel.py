"""``--loss-kernel auto``'s choice per GPU kind from ``gpu_bench`` loss-kernel rows: the fastest within memory.

Why here: the core keeps the choice (:data:`ecomkit.models.loss.GPU_LOSS_KERNEL`); tests/test_loss_kernel.py
holds it equal to :func:`fastest_loss_kernel` of the newest GPU artifact of each kind.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable

# A kernel replaces the chunked loss only when it is this much faster (a gain within a shared machine's noise goes
# to the default)...
LOSS_MIN_GAIN = 0.05
# ... and its peak memory is at most this much above the chunked loss's (full logits may be fast, but their
# [B, T, vocab] tensors are what the chunked loss exists to avoid).
LOSS_MEMORY_SLACK = 0.10


def fastest_loss_kernel(rows: Iterable[dict[str, Any]], min_gain: float = LOSS_MIN_GAIN,
                        memory_slack: float = LOSS_MEMORY_SLACK) -> str:
    """The kernel ``auto`` takes from one GPU's measurements: the fastest within the chunked loss's memory.

    ``rows``: ``{"kernel", "status", "step_s", "peak_mem_bytes"}`` per measurement (repeats: medians). A kernel
    is eligible when its peak memory is at most ``1 + memory_slack`` times the chunked loss's; the fastest
    eligible one is taken when it beats the chunked loss by more than ``min_gain``, else the chunked loss.
    """
    times: dict[str, list[float]] = {}
    peaks: dict[str, list[float]] = {}
    for r in rows:
        if r.get("status") == "ok":
            times.setdefault(r["kernel"], []).append(float(r["step_s"]))
            peaks.setdefault(r["kernel"], []).append(float(r["peak_mem_bytes"]))
    if "chunked" not in times:
        raise ValueError("no measured chunked-loss row: the kernels are compared with it")
    step = {k: statistics.median(v) for k, v in times.items()}
    peak = {k: statistics.median(v) for k, v in peaks.items()}
    eligible = [k for k in step if peak[k] <= (1 + memory_slack) * peak["chunked"]]
    best = min(eligible, key=step.__getitem__)
    return best if step["chunked"] > (1 + min_gain) * step[best] else "chunked"


__all__ = ["LOSS_MEMORY_SLACK", "LOSS_MIN_GAIN", "fastest_loss_kernel"]
