"""The planner's GPU efficiency: an assumption until GPU artifacts of this repository fit it, per GPU kind.

Unfitted, the compute term uses well-tuned large runs' efficiency, so GPU times are an upper bound on speed.
``ecomlab.derive.gpu_efficiency`` fits ``1 / e`` from ``benchmarks/gpu_bench.py`` rows and keeps it only if held-out
rows are predicted within 20 %.
"""

from __future__ import annotations

from ecomkit.hardware import gpu_kind
from ecomkit.planner.step_time import DEFAULT_EFFICIENCY

# Per GPU kind: the validated fit on the newest GPU artifact of that kind. Empty: no GPU artifact yet.
GPU_EFFICIENCY: dict[str, float] = {}


def efficiency_for(gpu: str, table: dict[str, float] | None = None) -> tuple[float, str | None]:
    """(efficiency, note) the planner uses for ``gpu``: the fitted one, or the default and why it is optimistic."""
    kind = gpu_kind(gpu)
    fitted = (GPU_EFFICIENCY if table is None else table).get(kind)
    if fitted is not None:
        return fitted, None
    return DEFAULT_EFFICIENCY, (
        f"GPU step times assume {DEFAULT_EFFICIENCY:.0%} of the {kind} peak FLOP/s, an assumption: no GPU artifact "
        "of this repository calibrates it yet (benchmarks/gpu_bench.py writes one), so they are an upper bound on "
        "speed (optimistic); a measured step will be slower. --efficiency X sets another")


__all__ = ["GPU_EFFICIENCY", "efficiency_for"]
