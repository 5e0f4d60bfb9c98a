"""Comparisons between finished runs, read from their metrics rows and summaries (chapters 02 and 04).

Why here and not in a notebook cell: a verdict a reader trusts ("the same
loss curve", "1.7× faster", "sentiment clipping did not help") must come from
code a unit test covers. Notebooks print and plot what these return.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


def train_losses(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """The per-step training losses of a metrics.jsonl (eval rows skipped)."""
    return [float(r["loss"]) for r in rows if r.get("type") == "train"]


def max_relative_loss_difference(rows: Sequence[Mapping[str, Any]],
                                 reference: Sequence[Mapping[str, Any]]) -> float:
    """Largest ``|loss - reference| / |reference|`` over the training steps both runs logged.

    Why: two runs with the same global batch follow the same curve up to float rounding when the parallel run is right.
    """
    mine = {r["step"]: float(r["loss"]) for r in rows if r.get("type") == "train"}
    ref = {r["step"]: float(r["loss"]) for r in reference if r.get("type") == "train"}
    steps = sorted(mine.keys() & ref.keys())
    if not steps:
        raise ValueError("the two runs share no logged training step")
    return max(abs(mine[k] - ref[k]) / abs(ref[k]) for k in steps)


def loss_fell(rows: Sequence[Mapping[str, Any]], min_drop: float) -> bool:
    """True when the last training loss is below the first by at least ``min_drop`` (relative, e.g. 0.02)."""
    losses = train_losses(rows)
    if len(losses) < 2:
        raise ValueError("need at least two training steps to tell whether the loss fell")
    return losses[-1] <= (1 - min_drop) * losses[0]


def eval_loss_ratio(rows: Sequence[Mapping[str, Any]]) -> float:
    """Last eval loss / first eval loss of a metrics.jsonl (the loop evaluates at step 0 when ``eval_interval`` > 0).

    Below 1 means the held-out loss fell; the first eval must be at step 0, before any update, so the
    ratio measures all of the training.
    """
    evals = [r for r in rows if "eval_loss" in r]
    if len(evals) < 2 or evals[0].get("step") != 0:
        raise ValueError("need an eval at step 0 and a later one (run with --eval-interval > 0)")
    return float(evals[-1]["eval_loss"]) / float(evals[0]["eval_loss"])


@dataclass(frozen=True)
class Scaling:
    """Throughput of a run on ``processes`` processes against a baseline."""

    speedup: float       # samples/s ratio
    efficiency: float    # speedup / processes (1.0 = ideal)


def scaling(summary: Mapping[str, Any], baseline: Mapping[str, Any], processes: int) -> Scaling:
    """Speed-up in samples/s of ``summary`` over ``baseline`` and its efficiency on ``processes`` processes."""
    speedup = summary["samples_per_s"] / baseline["samples_per_s"]
    return Scaling(speedup=speedup, efficiency=speedup / processes)


@dataclass(frozen=True)
class ClippingReport:
    """How a clip policy behaved in one run: eval results and their baselines, clip range, how often it clipped."""

    eval_loss: float
    acc_sentiment: float | None
    acc_category: float | None
    majority_sentiment: float | None   # majority-class baseline of the same scored records
    majority_category: float | None
    clip_min: float
    clip_max: float
    clipped_fraction: float   # steps whose gradient norm exceeded the clip value


def clipping_report(rows: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> ClippingReport:
    """Summarise one run's clipping from its metrics rows (``grad_norm``, ``clip``) and summary."""
    train = [r for r in rows if r.get("type") == "train"]
    if not train:
        raise ValueError("no training steps in the metrics")
    return ClippingReport(
        eval_loss=float(summary["eval_loss"]), acc_sentiment=summary.get("acc_sentiment"),
        acc_category=summary.get("acc_category"), majority_sentiment=summary.get("majority_sentiment"),
        majority_category=summary.get("majority_category"), clip_min=min(r["clip"] for r in train),
        clip_max=max(r["clip"] for r in train),
        clipped_fraction=sum(r["grad_norm"] > r["clip"] for r in train) / len(train))


# An arm has learned a classification task when its accuracy beats the majority-class baseline by this much.
LEARNED_MARGIN = 0.10
CLASSIFICATION_METRICS = ("acc_category", "acc_sentiment")


@dataclass(frozen=True)
class SeedSpread:
    """One metric of one arm over its seeds: mean and sample standard deviation (0 with one seed)."""

    mean: float
    std: float
    n: int


def seed_spread(values: Sequence[float]) -> SeedSpread:
    """Mean and sample standard deviation (n - 1 in the denominator) of one arm's per-seed values."""
    if not values:
        raise ValueError("no runs in this arm")
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return SeedSpread(mean, math.sqrt(var), n)


def margin_over_majority(report: ClippingReport, metric: str) -> float:
    """Accuracy minus its majority-class baseline for ``metric`` in ``acc_category``/``acc_sentiment``."""
    acc, base = getattr(report, metric), getattr(report, "majority_" + metric.removeprefix("acc_"))
    if acc is None or base is None:
        raise ValueError(f"the run has no {metric} or no majority baseline for it (an NLU run reports both)")
    return acc - base


@dataclass(frozen=True)
class ClipComparison:
    """Fixed vs sentiment-adaptive clipping on one metric, over several seeds per arm."""

    metric: str
    fixed: SeedSpread
    adaptive: SeedSpread
    difference: float          # adaptive mean - fixed mean (for eval_loss, negative is better)
    spread: float              # std of a one-seed difference: sqrt(std_fixed² + std_adaptive²)
    learned: bool              # every run of both arms beat the majority baseline by LEARNED_MARGIN
    verdict: str


def compare_clip_policies(fixed: Sequence[ClippingReport], adaptive: Sequence[ClippingReport],
                          metric: str = "acc_category", learned_margin: float = LEARNED_MARGIN) -> ClipComparison:
    """Verdict on ``metric`` (``acc_category``, ``acc_sentiment`` or ``eval_loss``) for seed-matched arms.

    The rules, in order:

    1. Both arms must have learned first: every run's category and sentiment
       accuracy beats its majority-class baseline by ``learned_margin``.
       Otherwise the runs say nothing about clipping ("not comparable").
    2. A difference needs a spread to be judged against, so each arm needs at
       least 2 seeds ("not enough seeds").
    3. The difference of the arm means counts only when it exceeds the seed
       spread, ``sqrt(std_fixed² + std_adaptive²)``: the typical difference
       between two single runs that differ only in their seed.
    """
    f = seed_spread([_metric(r, metric) for r in fixed])
    a = seed_spread([_metric(r, metric) for r in adaptive])
    learned = all(margin_over_majority(r, m) >= learned_margin
                  for r in (*fixed, *adaptive) for m in CLASSIFICATION_METRICS)
    diff, spread = a.mean - f.mean, math.sqrt(f.std ** 2 + a.std ** 2)
    better = -diff if metric == "eval_loss" else diff
    if not learned:
        verdict = (f"not comparable: a run has not learned (accuracy within {100 * learned_margin:.0f} points "
                   "of the majority baseline), so a difference would be noise")
    elif min(f.n, a.n) < 2:
        verdict = "not enough seeds: one run per arm gives no seed spread to judge a difference against"
    elif abs(diff) <= spread:
        verdict = "no difference beyond the seed spread"
    else:
        verdict = f"sentiment-adaptive clipping is {'better' if better > 0 else 'worse'}, beyond the seed spread"
    return ClipComparison(metric, f, a, diff, spread, learned, verdict)


def _metric(report: ClippingReport, metric: str) -> float:
    value = getattr(report, metric)
    if value is None:
        raise ValueError(f"the run has no {metric}")
    return float(value)
