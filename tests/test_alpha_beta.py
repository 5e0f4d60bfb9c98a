"""The α-β fit chapter 01 prints for its all-reduce sweep (``ecomkit.envcheck.alpha_beta``).

What is held: the fit recovers α and β from points of its own ring formula with no residual; on points it cannot
pass through, it reports the RMS of its relative misses, and no other line has a smaller weighted error (it is
the least-squares line); chapter 01's sweep rows (microseconds) are read in seconds.
"""

from __future__ import annotations

import math
import random

import pytest

from ecomkit.envcheck.alpha_beta import fit_collective, fit_sweep_rows, format_fit, ring_time_s

SIZES = [2**10 * 4**i for i in range(9)]      # chapter 01's sweep: 1 KiB to 64 MiB


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("n", [2, 3, 8])
def test_points_of_the_ring_formula_give_back_alpha_beta_and_no_residual(kind, n):
    fit = fit_collective([(s, ring_time_s(s, n, 40e-6, 1.5e9, kind)) for s in SIZES], n, kind)
    assert fit.alpha_s == pytest.approx(40e-6, rel=1e-9) and fit.bus_bytes_per_s == pytest.approx(1.5e9, rel=1e-9)
    assert fit.rms_residual == pytest.approx(0, abs=1e-9)
    assert fit.predict_s(3 * 2**20) == pytest.approx(ring_time_s(3 * 2**20, n, 40e-6, 1.5e9, kind))


def _weighted_error(samples, n, alpha, beta):
    return sum((ring_time_s(s, n, alpha, beta) / t - 1) ** 2 for s, t in samples)


@pytest.mark.parametrize("seed", range(5))
def test_noisy_points_the_fit_is_the_least_squares_line_and_its_residual_is_reported(seed):
    rng = random.Random(seed)
    samples = [(s, ring_time_s(s, 2, 60e-6, 0.8e9) * math.exp(rng.gauss(0, 0.2))) for s in SIZES]
    fit = fit_collective(samples, 2)
    misses = [fit.predict_s(s) / t - 1 for s, t in samples]
    assert fit.relative_residuals() == pytest.approx(misses)
    assert fit.rms_residual == pytest.approx(math.sqrt(sum(m * m for m in misses) / len(misses)))
    assert fit.rms_residual > 0.01                                       # noisy points: a residual to report
    best = _weighted_error(samples, 2, fit.alpha_s, fit.bus_bytes_per_s)
    for da, db in ((1.05, 1), (0.95, 1), (1, 1.05), (1, 0.95), (1.03, 0.97)):
        # weights 1/t² make the fitted line minimise the squared relative error (to first order in the misses)
        assert best <= _weighted_error(samples, 2, fit.alpha_s * da, fit.bus_bytes_per_s * db) * (1 + 1e-6)


def test_chapter01_rows_are_read_in_seconds_and_formatted():
    rows = [{"size_bytes": s, "time_us": 1e6 * ring_time_s(s, 2, 50e-6, 1e9)} for s in SIZES]
    fit = fit_sweep_rows(rows, 2)
    assert fit.alpha_s == pytest.approx(50e-6) and fit.bus_bytes_per_s == pytest.approx(1e9)
    text = format_fit(fit)
    assert "α = 50.0 µs per ring step" in text and "β = 1.000 GB/s" in text and "residual 0.0 %" in text
    assert fit.as_dict()["rms_residual"] == pytest.approx(0, abs=1e-9)


def test_a_fit_needs_two_processes_and_two_sizes():
    with pytest.raises(ValueError):
        fit_collective([(1024, 1e-4)], 2)
    with pytest.raises(ValueError):
        fit_collective([(1024, 1e-4), (4096, 2e-4)], 1)
