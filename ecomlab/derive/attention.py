"""``--attn auto``'s limits from ``bench_attn_rule`` artifacts: the longest length at which eager attention wins.

Why here: the core keeps the limits (:data:`ecomkit.models.attention.CPU_EAGER_MAX_SEQ` and
``GPU_EAGER_MAX_SEQ``); tests/test_attention_rule.py holds them equal to :func:`eager_max_seq` of the newest artifact.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable

# How much faster eager must be to be picked: SDPA keeps no [batch, heads, T, T] probabilities, so a tie, or a
# gain within the noise of a shared machine, goes to the smaller one.
EAGER_MIN_GAIN = 0.05


def eager_max_seq(rows: Iterable[dict[str, Any]], precision: str = "bf16", min_gain: float = EAGER_MIN_GAIN) -> int:
    """Longest measured ``seq`` up to which eager is faster than SDPA by ``min_gain`` at every measured length.

    Faster: SDPA's median step time over eager's is above ``1 + min_gain``, at every micro-batch measured at
    that length (``batch``, one per length on a CPU, 8 and 16 on a GPU).
    ``rows``: ``{"precision", "seq", "attn", "step_s"}`` (and ``batch``) per measurement (repeats allowed:
    medians are compared). Stops at the first length where SDPA is as fast or faster, so a lucky long length
    after a loss does not extend the range. 0 when eager loses at the shortest length.
    """
    times: dict[int, dict[Any, dict[str, list[float]]]] = {}
    for r in rows:
        if r["precision"] == precision:
            per_batch = times.setdefault(int(r["seq"]), {}).setdefault(r.get("batch"), {})
            per_batch.setdefault(r["attn"], []).append(float(r["step_s"]))
    best = 0
    for seq in sorted(times):
        for per in times[seq].values():
            if "eager" not in per or "sdpa" not in per:
                raise ValueError(f"seq {seq} ({precision}) has no {'eager' if 'eager' not in per else 'sdpa'} rows")
        if any(statistics.median(per["sdpa"]) <= (1 + min_gain) * statistics.median(per["eager"])
               for per in times[seq].values()):
            break
        best = seq
    return best


__all__ = ["EAGER_MIN_GAIN", "eager_max_seq"]
