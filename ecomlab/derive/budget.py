"""What share of generated answers running to the budget is worth advice: derived from ``bench_budget``'s runs.

Why measured: an evaluation counts the answers that used every new token allowed without ending
(``gen_at_budget``), and advises either training longer (the budget holds the longest training answer: the model
has not learned to end its answers) or raising ``--gen-max-new-tokens``. Said for 1 answer in 6,278 it sends a
user after nothing. Greedy answers that end within a budget are the same under any larger one, so following the
advice can change a figure by at most the share of answers at the budget, and by less when some of them stay
wrong. ``benchmarks/bench_budget.py`` measures that rate: trained models answer a held-out file at budgets that
cut their answers, and :func:`recovery_rate` is the points a figure regained per point of answers freed when
the budget was raised. :func:`advice_share` is the share at which the answers at the budget, regained at the
largest measured rate, move a figure by :data:`MEANINGFUL_POINTS`; below it the run counts them and says nothing
more (``ecomkit.train.gen_eval.BUDGET_ADVICE_SHARE``). The same runs' evaluation curves show the two states the
"train longer" advice tells apart: every answer at the budget until the model learns to end them, none after.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

MEANINGFUL_POINTS = 1.0   # a change of a score smaller than one point (of 100) is not worth another run


def at_budget_share(point: Mapping[str, Any]) -> float:
    """The share of one evaluation's answers that stopped at the budget (0 when nothing was decoded)."""
    return point["at_budget"] / point["decoded"] if point.get("decoded") else 0.0


def recovery_rate(sweep: Sequence[Mapping[str, Any]]) -> float | None:
    """Points of the figure regained per point of answers freed, from a cut budget to the largest in ``sweep``.

    ``sweep``: one model's answers at several budgets, each ``{"budget", "at_budget", "decoded", "score"}``
    (``score``: the mean of its generated figures, in points). Pooled over the cut budgets; None when no budget
    cut more answers than the largest.
    """
    ref = max(sweep, key=lambda p: p["budget"])
    freed = [(100.0 * (at_budget_share(p) - at_budget_share(ref)), ref["score"] - p["score"]) for p in sweep
             if at_budget_share(p) > at_budget_share(ref)]
    share = sum(s for s, _ in freed)
    return sum(g for _, g in freed) / share if share else None


def advice_share(sweeps: Sequence[Sequence[Mapping[str, Any]]], points: float = MEANINGFUL_POINTS) -> float:
    """The share of answers at the budget above which following the advice can move a figure by ``points``, at
    the largest recovery rate measured over ``sweeps`` (one per trained model)."""
    rates = [r for sweep in sweeps if (r := recovery_rate(sweep)) is not None]
    if not rates or max(rates) <= 0:
        raise ValueError("no budget in the sweeps cut an answer that a larger budget put right")
    return points / (100.0 * max(rates))


__all__ = ["MEANINGFUL_POINTS", "advice_share", "at_budget_share", "recovery_rate"]
