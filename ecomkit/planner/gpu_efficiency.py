"""The planner's GPU efficiency: an assumption until GPU artifacts of this repository fit it, per GPU kind.

Why: the time model's compute term is FLOPs over ``peak × efficiency``
(:func:`ecomkit.planner.step_time.predict_step_time`), and the efficiency
(:data:`~ecomkit.planner.step_time.DEFAULT_EFFICIENCY`, 0.45) is what
well-tuned large-model runs report, not what this code reaches on a given GPU.
Short rows, small models and a step's fixed costs all keep a real step below
it, so an unfitted GPU time is an **upper bound on speed** (optimistic), and
the plan says so (:func:`efficiency_for`).

How it is fitted (``ecomlab.derive.gpu_efficiency.calibrate``): ``benchmarks/gpu_bench.py`` writes,
beside each measured single-GPU row, the planner's prediction for the same job
split in two: ``plan_compute_s`` (the compute term at efficiency 1) and
``plan_other_s`` (everything else: optimizer, exposed communication). A
measured step ``m`` is then ``compute / e + other``; the efficiency is the
least-squares fit of ``1 / e`` over every other row, and the rows it was not
fitted on must then be predicted within 20 %. Only a calibration that
passes is kept: :data:`GPU_EFFICIENCY`, which ``tests/test_gpu_efficiency.py``
recomputes from the newest GPU artifact of each kind, so it cannot drift from
the measurement. It is empty while no such artifact exists.
"""

from __future__ import annotations

from ecomkit.hardware import gpu_kind
from ecomkit.planner.step_time import DEFAULT_EFFICIENCY

# Per GPU kind (ecomkit.hardware.gpu_kind): the efficiency ecomlab.derive.gpu_efficiency.calibrate() fitted and
# validated on the newest GPU artifact of benchmarks/gpu_bench.py of that kind. Empty: no GPU artifact yet.
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
