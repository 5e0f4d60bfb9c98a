"""Run comparisons that notebooks 02 and 04 print: loss agreement, scaling, clipping verdicts."""

from __future__ import annotations

import pytest

from ecomkit.train.comparisons import (clip_policy_verdict, clipping_report, max_relative_loss_difference,
                                       scaling)


def rows(losses, **extra):
    return [{"type": "train", "loss": x, **extra} for x in losses] + [{"type": "eval", "eval_loss": 9.9}]


def test_loss_difference_is_relative_to_the_reference_and_skips_eval_rows():
    assert max_relative_loss_difference(rows([2.0, 1.0]), rows([2.0, 1.0])) == 0.0
    assert max_relative_loss_difference(rows([2.2, 1.0]), rows([2.0, 1.0])) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        max_relative_loss_difference([], rows([1.0]))


def test_scaling_efficiency_is_speedup_over_processes():
    s = scaling({"samples_per_s": 30.0}, {"samples_per_s": 20.0}, processes=2)
    assert (s.speedup, s.efficiency) == (pytest.approx(1.5), pytest.approx(0.75))


def test_clipping_report_counts_steps_above_the_clip_value():
    metrics = [{"type": "train", "grad_norm": g, "clip": c} for g, c in ((2.0, 1.0), (0.5, 1.0), (0.4, 0.3), (0.1, 0.3))]
    report = clipping_report(metrics, {"eval_loss": 3.0, "acc_sentiment": 0.5})
    assert report.clipped_fraction == 0.5 and (report.clip_min, report.clip_max) == (0.3, 1.0)
    assert report.acc_sentiment == 0.5 and report.acc_category is None


def test_clip_verdict_needs_more_than_noise():
    assert clip_policy_verdict(3.00, 2.995)[0] == "no measurable benefit"
    verdict, delta = clip_policy_verdict(3.00, 2.95)
    assert verdict == "a small improvement in eval loss" and delta == pytest.approx(-0.05)
