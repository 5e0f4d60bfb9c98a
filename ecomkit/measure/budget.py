"""What share of generated answers running to the budget is worth a word: derived from ``bench_budget``'s curves.

Why measured: an evaluation counts the answers that used every new token allowed without ending
(``gen_at_budget``). Early in training nearly every answer does; a model that has learned its task still leaves a
few (a repeated span, a loop), and advising "train longer" or "raise --gen-max-new-tokens" for 1 answer in 6,278
sends a user after nothing. ``benchmarks/bench_budget.py`` trains the README's command on real-shaped files with
several seeds and evaluates by generation every few dozen steps; :func:`budget_share_floor` takes, over every
evaluation at which a run had learned its task, the largest share of answers still at the budget. Above it the
share is not what a trained model leaves, and the run's advice (``ecomkit.train.gen_eval.budget_advice``) speaks.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

LEARNED_SHARE = 0.9   # "learned": the run's margin over its baselines at this share of its best (as bench_recipe)


def margin_points(point: Mapping[str, Any]) -> float | None:
    """The mean margin of an evaluation's generated figures over their baselines, in points (None: no figure)."""
    pairs = [(point.get("gen_acc"), point.get("gen_majority_acc")), (point.get("gen_span_f1"), point.get("dict_span_f1"))]
    margins = [100.0 * (score - base) for score, base in pairs if score is not None and base is not None]
    return sum(margins) / len(margins) if margins else None


def learned_points(curve: Sequence[Mapping[str, Any]], learned_share: float = LEARNED_SHARE) -> list[Mapping[str, Any]]:
    """The evaluations of one run at which its margin had reached ``learned_share`` of its best (none if the best
    margin is not positive: the run never learned)."""
    margins = [(p, margin_points(p)) for p in curve]
    best = max((m for _, m in margins if m is not None), default=None)
    if best is None or best <= 0:
        return []
    return [p for p, m in margins if m is not None and m >= learned_share * best]


def at_budget_share(point: Mapping[str, Any]) -> float:
    return point["gen_at_budget"] / point["gen_decoded"] if point.get("gen_decoded") else 0.0


def budget_share_floor(curves: Sequence[Sequence[Mapping[str, Any]]], learned_share: float = LEARNED_SHARE) -> float:
    """The largest share of answers at the budget over every learned evaluation of every run: what trained models
    leave. A share above it is worth advice."""
    shares = [at_budget_share(p) for curve in curves for p in learned_points(curve, learned_share)]
    if not shares:
        raise ValueError("no run learned its task: the curves give no floor")
    return max(shares)


__all__ = ["LEARNED_SHARE", "at_budget_share", "budget_share_floor", "learned_points", "margin_points"]
