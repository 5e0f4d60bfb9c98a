"""``--packing auto``'s CPU bound from a ``bench_packing`` artifact: the longest seq_len where packing was faster.

Why here: the core keeps the bound (:data:`ecomkit.data.packing.CPU_PACK_MAX_SEQ_LEN`); tests/test_packing.py
holds it equal to :func:`cpu_packing_rule` of :func:`bench_packing_jobs` of the newest artifact.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

PACKING_MIN_GAIN = 0.05    # packed must beat bucketed by this much (median of the paired rounds) to count as faster


def bench_packing_jobs(artifact: dict) -> list[tuple[str, int, list[float]]]:
    """``(precision, seq_len, packed / bucketed ratios)`` of each job of a ``bench_packing`` artifact.

    A job is keyed ``"<data> <precision>"`` in ``extra["ratios"]``; its packed row gives the seq_len.
    """
    seq_len = {r["data"]: r["seq_len"] for r in artifact["rows"] if r["variant"].startswith("(b)")}
    return [(job.split()[-1], int(seq_len[job]), list(ratios)) for job, ratios in artifact["extra"]["ratios"].items()]


def cpu_packing_rule(measured: Sequence[tuple[str, int, Sequence[float]]], min_gain: float = PACKING_MIN_GAIN
                     ) -> dict[str, int]:
    """Precision -> the longest seq_len up to which every measured job at that precision packed faster.

    ``measured``: ``(precision, seq_len, packed / bucketed real-tokens/s ratios of the paired rounds)`` per job;
    faster means a median above ``1 + min_gain``. A precision whose shortest job was not faster is left out.
    """
    out: dict[str, int] = {}
    for precision in sorted({p for p, _, _ in measured}):
        jobs = sorted((seq, float(np.median(r))) for p, seq, r in measured if p == precision and len(r))
        for seq, ratio in jobs:
            if ratio <= 1 + min_gain:
                break
            out[precision] = seq
    return out


__all__ = ["PACKING_MIN_GAIN", "bench_packing_jobs", "cpu_packing_rule"]
