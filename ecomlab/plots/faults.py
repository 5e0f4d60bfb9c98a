"""Chapter 07 plots: an interrupted run resumed from a checkpoint, a preempted one, per-rank forward times."""

from __future__ import annotations

from typing import Sequence

from ecomlab.plots.common import _plt, finish_axes, train_rows


def split_attempts(rows: Sequence[dict]) -> list[list[dict]]:
    """Training rows of a metrics file cut into attempts: a new one starts when the step goes back.

    A resumed run appends to ``metrics.jsonl``: rows up to the kill, then rows
    again from the checkpoint's step + 1.
    """
    attempts: list[list[dict]] = []
    for r in train_rows(rows):
        if not attempts or r["step"] <= attempts[-1][-1]["step"]:
            attempts.append([])
        attempts[-1].append(r)
    return attempts


def _axes_with_reference(uninterrupted: Sequence[dict], key: str, ax):
    """The axes to draw on (a new figure when ``ax`` is None), with the uninterrupted run as a wide grey line."""
    fig = None
    if ax is None:
        fig, ax = _plt().subplots(figsize=(7.5, 4))
    ref = train_rows(uninterrupted)
    ax.plot([r["step"] for r in ref], [r[key] for r in ref], "-", color="0.6", lw=5, alpha=0.5,
            label="uninterrupted")
    return fig, ax


def plot_resume(uninterrupted: Sequence[dict], interrupted: Sequence[dict], kill_step: int | None = None,
                resumed_from: int | None = None, key: str = "loss", ax=None):
    """Loss per step of an uninterrupted run and of each attempt of an interrupted one, on one chart."""
    fig, ax = _axes_with_reference(uninterrupted, key, ax)
    styles = [("o-", "#C44E52"), ("s--", "#4C72B0"), ("^:", "#55A868")]
    for i, attempt in enumerate(split_attempts(interrupted)):
        marker, color = styles[i % len(styles)]
        label = "interrupted: attempt 1 (killed)" if i == 0 else f"interrupted: attempt {i + 1} (resumed)"
        ax.plot([r["step"] for r in attempt], [r[key] for r in attempt], marker, color=color, ms=4, lw=1.4,
                label=label)
    if kill_step is not None:
        ax.axvline(kill_step + 0.5, color="#C44E52", ls=":", lw=1)
        ax.annotate(f"rank killed after step {kill_step}", (kill_step + 0.5, ax.get_ylim()[1]), fontsize=8,
                    ha="left", va="top", color="#C44E52")
    if resumed_from is not None:
        ax.axvline(resumed_from, color="#4C72B0", ls=":", lw=1)
        ax.annotate(f"checkpoint step {resumed_from}", (resumed_from, ax.get_ylim()[0]), fontsize=8, ha="right",
                    va="bottom", color="#4C72B0")
    finish_axes(ax, "optimizer step", key,
                "a rank killed mid-run: torchrun restarts, training resumes from the checkpoint")
    return fig or ax.figure


def plot_preemption(uninterrupted: Sequence[dict], preempted: Sequence[dict], stops: Sequence[int],
                    signals: Sequence[str] = (), key: str = "loss", ax=None):
    """Loss per step of an uninterrupted run and of each launch of a preempted one, cut at its ``stops``.

    A preempted run stops right after a checkpointed step and its rerun starts at the next one, so the
    launches are told apart by the stop steps (not by a step going back, as after a kill).
    """
    fig, ax = _axes_with_reference(uninterrupted, key, ax)
    bounds = [0, *stops, float("inf")]
    styles = [("o-", "#C44E52"), ("s--", "#4C72B0"), ("^:", "#55A868"), ("d-.", "#8172B2")]
    rows = train_rows(preempted)
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        part = [r for r in rows if lo < r["step"] <= hi]
        marker, color = styles[i % len(styles)]
        how = f"stopped by {signals[i]}" if i < len(signals) else "finished"
        ax.plot([r["step"] for r in part], [r[key] for r in part], marker, color=color, ms=4, lw=1.4,
                label=f"launch {i + 1} ({'resumed, ' if i else ''}{how})")
    for i, stop in enumerate(stops):
        ax.axvline(stop + 0.5, color="#C44E52", ls=":", lw=1)
        ax.annotate(f"checkpoint step {stop}" + (f" ({signals[i]})" if i < len(signals) else ""),
                    (stop + 0.5, ax.get_ylim()[1]), fontsize=8, ha="left", va="top", color="#C44E52")
    finish_axes(ax, "optimizer step", key, "preempted: each signal ends a launch after a checkpoint; "
                "the rerun resumes")
    return fig or ax.figure


def plot_forward_times(health_rows: Sequence[dict], factor: float | None = None, ax=None):
    """Per-rank mean forward time at each health sample; a straggler stands out above the others."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 3.5))
    rows = [r for r in health_rows if r.get("type") == "health"]
    n_ranks = max((len(r["ranks"]) for r in rows), default=0)
    for rank in range(n_ranks):
        pts = [(r["step"], r["ranks"][rank]["forward_s"]) for r in rows if r["ranks"][rank].get("forward_s")]
        ax.plot([s for s, _ in pts], [t * 1e3 for _, t in pts], "o-", ms=4, label=f"rank {rank}")
    flagged = [(r["step"], r["ranks"][k]["forward_s"]) for r in rows for k in r.get("stragglers", [])]
    if flagged:
        ax.plot([s for s, _ in flagged], [t * 1e3 for _, t in flagged], "x", color="k", ms=10,
                label="flagged straggler" + (f" (> {factor:g}× others)" if factor else ""))
    finish_axes(ax, "optimizer step", "mean forward time (ms)", "straggler detection: forward time per rank")
    return fig or ax.figure
