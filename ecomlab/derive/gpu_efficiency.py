"""The planner's GPU efficiency fitted on a ``gpu_bench`` artifact, and kept only if it predicts held-out rows.

Why here: the core keeps the fitted values (:data:`ecomkit.planner.gpu_efficiency.GPU_EFFICIENCY`);
tests/test_gpu_efficiency.py holds them equal to the passing :func:`calibrate` of the newest GPU artifact per kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

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


__all__ = ["MAX_ERROR", "MIN_ROWS", "Calibration", "calibration_rows", "fit_efficiency", "predicted_step_s",
           "held_out_errors", "calibrate"]
