"""The planner's GPU efficiency: an assumption until GPU artifacts of this repository fit it, per GPU kind.

Why: the time model's compute term is FLOPs over ``peak × efficiency``
(:func:`ecomkit.planner.step_time.predict_step_time`), and the efficiency
(:data:`~ecomkit.planner.step_time.DEFAULT_EFFICIENCY`, 0.45) is what
well-tuned large-model runs report, not what this code reaches on a given GPU.
Short rows, small models and a step's fixed costs all keep a real step below
it, so an unfitted GPU time is an **upper bound on speed** (optimistic), and
the plan says so (:func:`efficiency_for`).

How it is fitted (:func:`calibrate`): ``benchmarks/gpu_bench.py`` writes,
beside each measured single-GPU row, the planner's prediction for the same job
split in two: ``plan_compute_s`` (the compute term at efficiency 1) and
``plan_other_s`` (everything else: optimizer, exposed communication). A
measured step ``m`` is then ``compute / e + other``; the efficiency is the
least-squares fit of ``1 / e`` over every other row (:func:`fit_efficiency`),
and the rows it was not fitted on must then be predicted within
:data:`MAX_ERROR` (20 %) (:func:`held_out_errors`). Only a calibration that
passes is kept: :data:`GPU_EFFICIENCY`, which ``tests/test_gpu_efficiency.py``
recomputes from the newest GPU artifact of each kind, so it cannot drift from
the measurement. It is empty while no such artifact exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ecomkit.hardware import gpu_kind
from ecomkit.planner.step_time import DEFAULT_EFFICIENCY

# Per GPU kind (ecomkit.hardware.gpu_kind): the efficiency calibrate() fitted and validated on the newest GPU
# artifact of benchmarks/gpu_bench.py of that kind. Empty: no GPU artifact of this repository exists yet.
GPU_EFFICIENCY: dict[str, float] = {}
MAX_ERROR = 0.20          # held-out rows predicted within this relative error, or the fit is not kept
MIN_ROWS = 4              # two to fit on, two to validate on, at least


@dataclass(frozen=True)
class Calibration:
    """One GPU kind's fit: the efficiency, the rows it rests on, and how it predicts the others."""

    efficiency: float
    fitted_on: int
    validated_on: int
    worst_error: float           # largest |predicted / measured - 1| over the held-out rows

    @property
    def ok(self) -> bool:
        return self.worst_error <= MAX_ERROR and 0 < self.efficiency <= 1


def calibration_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of a gpu_bench artifact that carry a measured step and the planner's split prediction."""
    return [r for r in rows if r.get("status") == "ok" and r.get("step_time_s") and r.get("plan_compute_s")
            and r.get("plan_other_s") is not None]


def fit_efficiency(rows: Sequence[dict[str, Any]]) -> float:
    """Least-squares ``e`` in ``measured = compute / e + other`` (linear in ``1 / e``) over ``rows``."""
    num = sum(r["plan_compute_s"] * (r["step_time_s"] - r["plan_other_s"]) for r in rows)
    den = sum(r["plan_compute_s"] ** 2 for r in rows)
    if den <= 0 or num <= 0:
        raise ValueError("no row has compute time left after the other terms: nothing to fit an efficiency on")
    return den / num


def predicted_step_s(row: dict[str, Any], efficiency: float) -> float:
    return row["plan_compute_s"] / efficiency + row["plan_other_s"]


def held_out_errors(rows: Sequence[dict[str, Any]], efficiency: float) -> list[float]:
    """``|predicted / measured - 1|`` of each row at ``efficiency``."""
    return [abs(predicted_step_s(r, efficiency) / r["step_time_s"] - 1) for r in rows]


def calibrate(rows: Iterable[dict[str, Any]]) -> Calibration | None:
    """Fit on every other row (in the artifact's order), validate on the rest; None with fewer than MIN_ROWS."""
    usable = calibration_rows(rows)
    if len(usable) < MIN_ROWS:
        return None
    fit, held = usable[0::2], usable[1::2]
    eff = fit_efficiency(fit)
    return Calibration(eff, len(fit), len(held), max(held_out_errors(held, eff)))


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


__all__ = ["GPU_EFFICIENCY", "MAX_ERROR", "MIN_ROWS", "Calibration", "calibration_rows", "fit_efficiency",
           "predicted_step_s", "held_out_errors", "calibrate", "efficiency_for"]
