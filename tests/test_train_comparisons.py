"""Run comparisons that notebooks 02 and 04 print: loss agreement, scaling, clipping verdicts."""

from __future__ import annotations

import math

import pytest

from ecomlab.measure.run_comparisons import (ClippingReport, compare_clip_policies, clipping_report, eval_loss_ratio,
                                             margin_over_majority, max_relative_loss_difference, scaling, seed_spread)


def rows(losses, **extra):
    return [{"type": "train", "step": i + 1, "loss": x, **extra} for i, x in enumerate(losses)] + [
        {"type": "eval", "step": len(losses), "eval_loss": 9.9}]


def test_loss_difference_is_relative_to_the_reference_and_skips_eval_rows():
    assert max_relative_loss_difference(rows([2.0, 1.0]), rows([2.0, 1.0])) == 0.0
    assert max_relative_loss_difference(rows([2.2, 1.0]), rows([2.0, 1.0])) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        max_relative_loss_difference([], rows([1.0]))


def test_eval_loss_ratio_is_last_over_the_step_0_eval():
    metrics = [{"type": "eval", "step": 0, "eval_loss": 8.0}, {"type": "train", "step": 1, "loss": 7.0},
               {"type": "train", "step": 2, "loss": 6.0, "eval_loss": 6.0},
               {"type": "eval", "step": 4, "eval_loss": 4.0}]
    assert eval_loss_ratio(metrics) == 0.5
    with pytest.raises(ValueError):   # no eval before training: the ratio would miss the start
        eval_loss_ratio(metrics[1:])


def test_scaling_efficiency_is_speedup_over_processes():
    s = scaling({"samples_per_s": 30.0}, {"samples_per_s": 20.0}, processes=2)
    assert (s.speedup, s.efficiency) == (pytest.approx(1.5), pytest.approx(0.75))


def test_clipping_report_counts_steps_above_the_clip_value():
    metrics = [{"type": "train", "grad_norm": g, "clip": c}
               for g, c in ((2.0, 1.0), (0.5, 1.0), (0.4, 0.3), (0.1, 0.3))]
    report = clipping_report(metrics, {"eval_loss": 3.0, "acc_sentiment": 0.5, "majority_sentiment": 0.55})
    assert report.clipped_fraction == 0.5 and (report.clip_min, report.clip_max) == (0.3, 1.0)
    assert report.acc_sentiment == 0.5 and report.acc_category is None
    assert margin_over_majority(report, "acc_sentiment") == pytest.approx(-0.05)
    with pytest.raises(ValueError):
        margin_over_majority(report, "acc_category")


def test_seed_spread_uses_the_sample_standard_deviation():
    s = seed_spread([1.0, 2.0, 3.0])
    assert (s.mean, s.std, s.n) == (2.0, 1.0, 3)
    assert seed_spread([0.4]).std == 0.0
    with pytest.raises(ValueError):
        seed_spread([])


def report(acc_category, acc_sentiment=0.9, eval_loss=1.5, majority_category=0.15, majority_sentiment=0.55):
    return ClippingReport(eval_loss=eval_loss, acc_sentiment=acc_sentiment, acc_category=acc_category,
                          majority_sentiment=majority_sentiment, majority_category=majority_category,
                          clip_min=1.0, clip_max=1.0, clipped_fraction=0.5)


def test_a_difference_counts_only_beyond_the_seed_spread_and_the_verdict_flips():
    fixed = [report(0.60), report(0.62), report(0.64)]            # mean 0.62, std 0.02
    close = [report(0.63), report(0.65), report(0.61)]            # mean 0.63: inside the spread
    far = [report(0.70), report(0.72), report(0.74)]              # mean 0.72: 0.10 > sqrt(2) × 0.02
    c = compare_clip_policies(fixed, close)
    assert c.verdict == "no difference beyond the seed spread"
    assert c.difference == pytest.approx(0.01) and c.spread == pytest.approx(math.sqrt(2) * 0.02)
    assert compare_clip_policies(fixed, far).verdict == "sentiment-adaptive clipping is better, beyond the seed spread"
    assert compare_clip_policies(far, fixed).verdict == "sentiment-adaptive clipping is worse, beyond the seed spread"


def test_lower_eval_loss_is_better():
    fixed = [report(0.6, eval_loss=x) for x in (1.50, 1.52, 1.51)]
    adaptive = [report(0.6, eval_loss=x) for x in (1.30, 1.31, 1.29)]
    c = compare_clip_policies(fixed, adaptive, metric="eval_loss")
    assert c.difference == pytest.approx(-0.21) and "better" in c.verdict


def test_runs_that_have_not_learned_are_not_compared():
    learned = [report(0.60), report(0.62)]
    # sentiment at the majority baseline in one run: the model answers "positive" whatever the review
    unlearned = [report(0.90), report(0.92, acc_sentiment=0.55)]
    c = compare_clip_policies(learned, unlearned)
    assert not c.learned and c.verdict.startswith("not comparable")
    assert compare_clip_policies(learned, learned).learned


def test_one_seed_per_arm_gives_no_verdict_on_a_difference():
    c = compare_clip_policies([report(0.60)], [report(0.90)])
    assert c.learned and c.verdict.startswith("not enough seeds")
