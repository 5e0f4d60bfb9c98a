"""The planner's GPU efficiency: said to be optimistic until fitted, fitted on GPU artifacts, validated held out."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ecomkit.hardware import gpu_kind
from ecomkit.planner import gpu_efficiency
from ecomkit.planner.cli import main, read_job, render, run_plan, to_json
from ecomkit.planner.gpu_efficiency import GPU_EFFICIENCY, efficiency_for
from ecomkit.planner.step_time import DEFAULT_EFFICIENCY
from ecomlab.derive.gpu_efficiency import MAX_ERROR, calibrate, fit_efficiency, held_out_errors

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
JOB = ["--model", "seqgpt-560m", "--gpus", "1", "--gpu", "h200", "--precision", "bf16", "--seq-len", "1024"]


def test_an_uncalibrated_gpu_plan_says_its_times_are_an_upper_bound_on_speed(monkeypatch):
    monkeypatch.setattr(gpu_efficiency, "GPU_EFFICIENCY", {})
    result = run_plan(read_job(JOB))
    text = render(result)
    assert "upper bound on speed (optimistic)" in text and "h200" in text and "--efficiency X" in text
    assert result["efficiency"] == DEFAULT_EFFICIENCY
    assert any("upper bound on speed" in n for n in to_json(result)["notes"])
    given = run_plan(read_job([*JOB, "--efficiency", "0.3"]))   # the user's own figure: nothing to warn about
    assert "upper bound on speed" not in render(given) and given["efficiency"] == 0.3


def test_a_fitted_gpu_uses_its_efficiency_and_drops_the_note(monkeypatch):
    monkeypatch.setattr(gpu_efficiency, "GPU_EFFICIENCY", {"h200": 0.3})
    fitted = run_plan(read_job(JOB))
    assert "upper bound on speed" not in render(fitted) and fitted["efficiency"] == 0.3
    assert fitted["step"].total_s == pytest.approx(run_plan(read_job([*JOB, "--efficiency", "0.3"]))["step"].total_s)
    assert efficiency_for("NVIDIA H200") == (0.3, None)     # the device name torch reports is the same kind


def test_recommend_says_it_too(monkeypatch, capsys):
    monkeypatch.setattr(gpu_efficiency, "GPU_EFFICIENCY", {})
    main([*JOB, "--recommend", "--top", "2"])
    assert "upper bound on speed (optimistic)" in capsys.readouterr().out


def rows(efficiency: float, n: int = 8, noise: float = 0.05, seed: int = 0) -> list[dict]:
    """Measured steps ``compute / efficiency + other``, each off by up to ``noise``."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        compute, other = 0.02 * (k + 1), 0.005 * (k % 3)
        out.append({"status": "ok", "plan_compute_s": compute, "plan_other_s": other,
                    "step_time_s": (compute / efficiency + other) * (1 + rng.uniform(-noise, noise))})
    return out


def test_fit_recovers_the_efficiency_and_validates_on_rows_it_was_not_fitted_on():
    cal = calibrate(rows(0.3))
    assert cal is not None and cal.ok and cal.fitted_on == cal.validated_on == 4
    assert cal.efficiency == pytest.approx(0.3, rel=0.05) and cal.worst_error <= MAX_ERROR
    assert fit_efficiency(rows(0.5, noise=0.0)) == pytest.approx(0.5)


def test_a_fit_that_misses_its_held_out_rows_is_not_kept():
    mixed = [r for pair in zip(rows(0.2), rows(0.6)) for r in pair]   # every other row at another efficiency
    cal = calibrate(mixed)
    assert cal is not None and not cal.ok and cal.worst_error > MAX_ERROR
    assert max(held_out_errors(rows(0.6)[1::2], cal.efficiency)) > MAX_ERROR
    assert calibrate(rows(0.3, n=3)) is None                               # too few rows to hold any out
    assert calibrate([{"status": "error"}] * 8) is None


def test_gpu_table_is_the_committed_calibration_or_empty():
    """GPU_EFFICIENCY equals the passing calibrate() of the newest GPU gpu_bench artifact of each kind; none: {}."""
    newest: dict[str, dict] = {}
    for path in RESULTS.glob("gpu_bench-*.json"):
        doc = json.loads(path.read_text())
        if doc.get("gpu") and not doc["extra"].get("dry_run"):
            kind = gpu_kind(doc["gpu"])
            if kind not in newest or doc["time_utc"] > newest[kind]["time_utc"]:
                newest[kind] = doc
    expected = {}
    for kind, doc in newest.items():
        cal = calibrate(doc["rows"])
        if cal is not None and cal.ok:
            expected[kind] = pytest.approx(cal.efficiency, rel=1e-3)
    assert GPU_EFFICIENCY == expected
