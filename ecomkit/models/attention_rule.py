"""``--attn auto`` (the default): which attention a run uses, by device, precision and sequence length.

Why a rule: SDPA wins on memory everywhere and on time at long sequences, but on a CPU at short sequences eager
can be faster. The crossovers are measured per precision (CPU) and per GPU kind; tests recompute them from the
committed artifacts. A GPU kind without a measurement gets SDPA, and the ``auto`` line says so.
"""

from __future__ import annotations

# Per precision, the longest sequence length at which eager attention trained faster than SDPA on a CPU.
CPU_EAGER_MAX_SEQ: dict[str, int] = {"fp32": 0, "bf16": 256}
# Per GPU kind, per precision, the same crossover on that GPU; empty while unmeasured (auto is sdpa there).
GPU_EAGER_MAX_SEQ: dict[str, dict[str, int]] = {}


def pick_attention(requested: str, precision: str, device_type: str, seq_len: int,
                   eager_max_seq: dict[str, int] | None = None, gpu_kind: str | None = None,
                   gpu_eager_max_seq: dict[str, dict[str, int]] | None = None) -> tuple[str, str]:
    """(implementation, why) for ``--attn requested``; anything but ``auto`` is returned as asked.
    ``eager_max_seq``: the CPU limits (default :data:`CPU_EAGER_MAX_SEQ`); ``gpu_kind`` and
    ``gpu_eager_max_seq``: the CUDA device's kind and the per-kind limits (default :data:`GPU_EAGER_MAX_SEQ`)."""
    if requested != "auto":
        return requested, f"--attn {requested} as asked"
    if device_type == "cpu":
        limit = (CPU_EAGER_MAX_SEQ if eager_max_seq is None else eager_max_seq).get(precision, 0)
        where = "on CPU"
    elif device_type == "cuda":
        limits = (GPU_EAGER_MAX_SEQ if gpu_eager_max_seq is None else gpu_eager_max_seq).get(gpu_kind or "")
        if limits is None:
            return "sdpa", (f"auto: sdpa, the GPU rule while unmeasured on this GPU ({gpu_kind}): no "
                            "bench_attn_rule artifact of this repository is from one (python "
                            "benchmarks/bench_attn_rule.py on it measures where eager is faster)")
        limit, where = limits.get(precision, 0), f"on {gpu_kind}"
    else:
        return "sdpa", f"auto: sdpa (fused attention on {device_type}: as fast or faster, and smaller)"
    if seq_len <= limit:
        return "eager", (f"auto: eager, measured faster than sdpa {where} at {precision} up to seq {limit} "
                         f"(bench_attn_rule); this run's --seq-len is {seq_len}")
    return "sdpa", (f"auto: sdpa, since --seq-len {seq_len} is beyond seq {limit}, the longest at which eager was "
                    f"measured faster {where} at {precision} (bench_attn_rule; 0 = at no measured length)")


__all__ = ["CPU_EAGER_MAX_SEQ", "GPU_EAGER_MAX_SEQ", "pick_attention"]
