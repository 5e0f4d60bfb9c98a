"""Throughput accounting: totals over the steady phase, never a mean of per-step rates."""

from __future__ import annotations

import pytest

from ecomkit.metrics import throughput_summary


def _rows(step_times, samples=16, tokens_per_sample=100):
    return [{"step_time_s": t, "samples": samples, "tokens": samples * tokens_per_sample} for t in step_times]


def test_uneven_steps_are_divided_as_totals():
    # warm-up 5 s, then one slow bucket (0.4 s) and three fast ones (0.1 s): 64 samples in 0.7 s
    s = throughput_summary(_rows([5.0, 0.4, 0.1, 0.1, 0.1]), warmup_steps=1)
    assert s["steady_steps"] == 4
    assert s["samples_per_s"] == pytest.approx(64 / 0.7)
    assert s["tokens_per_s"] == pytest.approx(6400 / 0.7)
    mean_of_rates = sum(16 / t for t in (0.4, 0.1, 0.1, 0.1)) / 4
    assert mean_of_rates > 1.4 * s["samples_per_s"]       # the old accounting overstated it
    assert s["step_time_s"] == pytest.approx(0.7 / 4)
    assert s["step_time_median_s"] == pytest.approx(0.1)
    assert s["step_time_p90_s"] == pytest.approx(0.4 - 0.3 * 0.3)   # between the two largest of 4 values


def test_slowest_rank_sets_the_pace():
    rows = _rows([1.0, 0.5, 0.5])
    own = throughput_summary(rows)
    slow = throughput_summary(rows, slowest_rank_steady_s=2.0)
    assert own["samples_per_s"] == pytest.approx(32 / 1.0)
    assert slow["samples_per_s"] == pytest.approx(32 / 2.0)
    # a faster "slowest" figure than our own cannot speed us up
    assert throughput_summary(rows, slowest_rank_steady_s=0.1)["samples_per_s"] == pytest.approx(32 / 1.0)


def test_short_runs_keep_their_rows():
    s = throughput_summary(_rows([0.2]), warmup_steps=1)
    assert s["steady_steps"] == 1 and s["samples_per_s"] == pytest.approx(80.0)
    assert throughput_summary([], warmup_steps=1)["steady_steps"] == 0
