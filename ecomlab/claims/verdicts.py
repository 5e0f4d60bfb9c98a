"""The six verdicts and the rules that hand them out; the only module that names a verdict.

A claim's verdict is the output of one of these rules applied to numbers:
a measurement from a benchmark artifact, a planner or time-model prediction,
or a first-principles bound (bytes ÷ link bandwidth, 16Ψ, N×). The ledger's
entries (``ch0N.py``) call these rules and never name a verdict themselves,
so a changed artifact or a changed model changes the page.

What each verdict means here:

- ``reproduced``: a measurement of the claimed setup agrees within the stated tolerance;
- ``reproduced (CPU analogue)``: the same mechanism, measured on CPU processes, agrees;
- ``refuted``: a measurement, or the time model over its whole assumption band, disagrees;
- ``physically implausible``: the claim breaks a bound that holds for any implementation;
- ``needs GPU``: nothing here contradicts it, and only a GPU measurement (named) can confirm it;
- ``not measurable``: the claim has no defined measurement (no baseline, an outcome outside training).
"""

from __future__ import annotations

from dataclasses import dataclass

from ecomlab.claims.planner_comparisons import speedup_verdict

REPRODUCED = "reproduced"
CPU_ANALOGUE = "reproduced (CPU analogue)"
REFUTED = "refuted"
IMPLAUSIBLE = "physically implausible"
NEEDS_GPU = "needs GPU"
NOT_MEASURABLE = "not measurable"
VERDICTS = (REPRODUCED, CPU_ANALOGUE, REFUTED, IMPLAUSIBLE, NEEDS_GPU, NOT_MEASURABLE)


@dataclass(frozen=True)
class Finding:
    """A verdict with the numbers behind it, where they come from, and why they decide it."""

    verdict: str
    evidence: str     # the numbers, e.g. "predicted 2.0× [1.5–2.7]"
    source: str       # the function, artifact or test they come from
    reason: str       # one line

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}; one of {VERDICTS}")


def pct(x: float) -> str:
    """A fraction as a percentage with enough digits to tell small ones apart (0.2 %, 12 %)."""
    return f"{x:.0%}" if abs(x) >= 0.01 else f"{x:.2%}"


def agrees(claimed: float, measured: float, rel_tol: float, *, evidence: str, source: str,
           on_cpu: bool = False) -> Finding:
    """A measurement against a claimed figure: within ``rel_tol`` (relative) reproduces it, else refutes it."""
    off = abs(measured / claimed - 1)
    if off <= rel_tol:
        return Finding(CPU_ANALOGUE if on_cpu else REPRODUCED, evidence, source,
                       f"within {pct(rel_tol)} of the claim ({pct(off)} off)")
    return Finding(REFUTED, evidence, source, f"{pct(off)} away from the claim (tolerance {pct(rel_tol)})")


def at_most(claimed: float, bound: float, *, evidence: str, source: str, bound_why: str,
            otherwise: Finding | None = None, decided_by: str = "a GPU measurement") -> Finding:
    """A claim above a hard bound is implausible; at or below it, ``otherwise`` decides (or ``decided_by``)."""
    if claimed > bound:
        return Finding(IMPLAUSIBLE, evidence, source, f"above the bound {bound:.3g}: {bound_why}")
    return otherwise or Finding(NEEDS_GPU, evidence, source, f"within the bound; decided by {decided_by}")


def at_least(claimed: float, bound: float, *, evidence: str, source: str, bound_why: str,
             otherwise: Finding | None = None, decided_by: str = "a GPU measurement") -> Finding:
    """A claim below a hard lower bound is implausible; at or above it, ``otherwise`` decides (or ``decided_by``)."""
    if claimed < bound:
        return Finding(IMPLAUSIBLE, evidence, source, f"below the bound {bound:.3g}: {bound_why}")
    return otherwise or Finding(NEEDS_GPU, evidence, source, f"within the bound; decided by {decided_by}")


def model_band(claimed: float, n: float, low: float, high: float, *, evidence: str, source: str,
               gpu_measurement: str) -> Finding:
    """A claimed speed-up against the time model's band over its assumptions (planner.comparisons.speedup_verdict).

    Above N× is implausible; outside the band the model refutes it; inside,
    only ``gpu_measurement`` (the gpu_bench.py measurement that will decide it) can confirm it.
    """
    v = speedup_verdict(claimed, n, low, high)
    if v == "implausible":
        return Finding(IMPLAUSIBLE, evidence, source,
                       f"more than {n:g}× on {n:g} workers: each would do < 1/N of the work")
    if v == "within the model's range":
        return Finding(NEEDS_GPU, evidence, source, f"inside the time model's band; decided by {gpu_measurement}")
    return Finding(REFUTED, evidence, source,
                   f"{v.removesuffix(' range')} band over all its assumptions; {gpu_measurement} can overturn it")


def consistent_with(claimed: float, low: float, high: float, *, evidence: str, source: str,
                    gpu_measurement: str) -> Finding:
    """A claimed figure against a predicted range: inside waits for ``gpu_measurement``, outside is refuted."""
    if low <= claimed <= high:
        return Finding(NEEDS_GPU, evidence, source, f"consistent with the prediction; decided by {gpu_measurement}")
    side = "above" if claimed > high else "below"
    return Finding(REFUTED, evidence, source, f"{side} the predicted range [{low:.3g}, {high:.3g}]")


def holds(condition: bool, *, evidence: str, source: str, why_true: str, why_false: str,
          on_cpu: bool = True) -> Finding:
    """A qualitative claim checked by a computed condition: reproduced (on CPU) when it holds, refuted when not."""
    if condition:
        return Finding(CPU_ANALOGUE if on_cpu else REPRODUCED, evidence, source, why_true)
    return Finding(REFUTED, evidence, source, why_false)


def wrong_recipe(problems: list[str], *, evidence: str, source: str, why_ok: str) -> Finding:
    """A recipe checked by code (a lint, a reading of what the code does): any problem refutes it."""
    if problems:
        return Finding(REFUTED, evidence, source, "; ".join(problems))
    return Finding(CPU_ANALOGUE, evidence, source, why_ok)


def undefined(missing: str, *, evidence: str, source: str) -> Finding:
    """A claim whose measurement is not defined by what it states: ``missing`` says what it lacks."""
    return Finding(NOT_MEASURABLE, evidence, source, missing)
