"""Comparisons between finished runs, read from their metrics rows and summaries (chapters 02 and 04).

Why here and not in a notebook cell: a verdict a reader trusts ("the same
loss curve", "1.7× faster", "sentiment clipping did not help") must come from
code a unit test covers. Notebooks print and plot what these return.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

# An eval-loss difference smaller than this is within one seed's noise on the tiny models.
EVAL_LOSS_NOISE = 0.01


def train_losses(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    """The per-step training losses of a metrics.jsonl (eval rows skipped)."""
    return [float(r["loss"]) for r in rows if r.get("type") == "train"]


def max_relative_loss_difference(rows: Sequence[Mapping[str, Any]],
                                 reference: Sequence[Mapping[str, Any]]) -> float:
    """Largest ``|loss - reference| / |reference|`` over the steps both runs have.

    Two runs with the same global batch must follow the same loss curve up to
    float rounding (DDP vs one process, FSDP2/TP/PP vs one process), so this
    is ~1e-6 when the parallel run is correct.
    """
    pairs = list(zip(train_losses(rows), train_losses(reference)))
    if not pairs:
        raise ValueError("no training steps to compare")
    return max(abs(a - b) / abs(b) for a, b in pairs)


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
    """How a clip policy behaved in one run: eval results, clip range, and how often it clipped."""

    eval_loss: float
    acc_sentiment: float | None
    acc_category: float | None
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
        acc_category=summary.get("acc_category"), clip_min=min(r["clip"] for r in train),
        clip_max=max(r["clip"] for r in train),
        clipped_fraction=sum(r["grad_norm"] > r["clip"] for r in train) / len(train))


def clip_policy_verdict(fixed_eval_loss: float, adaptive_eval_loss: float,
                        noise: float = EVAL_LOSS_NOISE) -> tuple[str, float]:
    """(verdict, Δ eval loss) of the sentiment-adaptive policy against the fixed one.

    An improvement counts only when the eval loss drops by more than ``noise``;
    one seed on a tiny model cannot resolve less.
    """
    delta = adaptive_eval_loss - fixed_eval_loss
    return ("no measurable benefit" if delta >= -noise else "a small improvement in eval loss"), delta
