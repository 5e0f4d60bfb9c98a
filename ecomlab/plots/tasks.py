"""Chapter 08 plots: scores by generation over the evaluations, per-label F1 beside the dictionary baseline, and
the confusion of generated labels."""

from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

from ecomlab.plots.common import _plt, finish_axes

CURVES = (("gen_span_f1", "span micro-F1 (generated)", "-o", "#4C72B0"),
          ("dict_span_f1", "span F1, dictionary baseline", ":", "#4C72B0"),
          ("gen_acc", "label accuracy (generated)", "-s", "#C44E52"),
          ("gen_majority_acc", "accuracy, majority baseline", ":", "#C44E52"))


def eval_rows(rows: Sequence[dict]) -> list[dict]:
    """The metrics rows that carry scores by generation, in step order."""
    return sorted((r for r in rows if "gen_decoded" in r), key=lambda r: r["step"])


def plot_task_curves(rows: Sequence[dict], ax=None):
    """Span F1 and label accuracy by generation at every evaluation, each beside its baseline (dotted)."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.8))
    ev = eval_rows(rows)
    for key, label, style, color in CURVES:
        pts = [(r["step"], r[key]) for r in ev if r.get(key) is not None]
        if pts:
            ax.plot([s for s, _ in pts], [v for _, v in pts], style, color=color, label=label, lw=1.6, ms=4)
    ax.set_ylim(-0.02, 1.02)
    finish_axes(ax, "optimizer step", "score on held-out examples", "evaluation by generation, over training")
    return fig or ax.figure


def plot_per_label_f1(per_label: Mapping[str, float], baseline: Mapping[str, float] | None = None, ax=None):
    """One bar per label: the model's span F1, with the dictionary baseline's beside it when given."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.5, 3.5))
    labels = list(per_label)
    xs = range(len(labels))
    width = 0.4 if baseline else 0.7
    ax.bar([x - (width / 2 if baseline else 0) for x in xs], [per_label[k] for k in labels], width,
           label="model (generated)", color="#4C72B0")
    if baseline:
        ax.bar([x + width / 2 for x in xs], [baseline.get(k, 0.0) for k in labels], width,
               label="dictionary baseline", color="0.7")
    ax.set_xticks(list(xs), labels)
    ax.set_ylim(0, 1.05)
    finish_axes(ax, "label", "span F1", "span F1 per label")
    return fig or ax.figure


def confusion_counts(golds: Sequence[str], preds: Sequence[str | None]) -> tuple[list[str], list[list[int]]]:
    """Labels (gold ones first, then predicted, then "(none)" for unreadable answers) and ``counts[gold][pred]``."""
    names = sorted(set(golds)) + sorted({p for p in preds if p is not None} - set(golds))
    if any(p is None for p in preds):
        names.append("(none)")
    pairs = Counter((g, p if p is not None else "(none)") for g, p in zip(golds, preds))
    return names, [[pairs[(g, p)] for p in names] for g in names]


def plot_confusion(golds: Sequence[str], preds: Sequence[str | None], title: str = "generated labels", ax=None):
    """The confusion matrix of generated labels (rows: gold, columns: predicted), counts written in the cells."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(5, 4.2))
    names, counts = confusion_counts(golds, preds)
    ax.imshow(counts, cmap="Blues")
    for i, row in enumerate(counts):
        for j, n in enumerate(row):
            if n:
                ax.text(j, i, str(n), ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title)
    return fig or ax.figure
