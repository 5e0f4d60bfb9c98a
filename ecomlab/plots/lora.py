"""Chapter 03 plot: full fine-tuning vs LoRA, model-state bytes per rank (measured), planner's figure beside it."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ecomlab.plots.common import _plt
from ecomlab.plots.zero import COLORS, MIB


def plot_lora_memory(rows: Sequence[Mapping[str, Any]], ax=None, unit: float = MIB, unit_name: str = "MiB"):
    """Stacked bars (params, grads, optimizer) per run, planned total as a black tick.

    ``rows``: one per run with ``label``, ``measured`` and ``planned`` (each a dict of params / grads /
    optimizer bytes of one rank), e.g. from a ``scripts/03_lora.py`` launch and
    :func:`ecomkit.planner.lora.lora_state_bytes_per_rank`.
    """
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4))
    labels = [r["label"] for r in rows]
    bottom = [0.0] * len(rows)
    for cat in ("params", "grads", "optimizer"):
        vals = [r["measured"][cat] / unit for r in rows]
        ax.bar(labels, vals, bottom=bottom, color=COLORS[cat], label=cat, edgecolor="white")
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):
        planned = sum(r["planned"][k] for k in ("params", "grads", "optimizer")) / unit
        ax.plot([i - 0.4, i + 0.4], [planned] * 2, color="black", lw=2, label="planner" if i == 0 else None)
    ax.set_ylabel(f"model states per rank ({unit_name})")
    ax.set_title("full fine-tuning vs LoRA: what one rank holds (measured), and the planner")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    ax.tick_params(axis="x", labelsize=8)
    return fig or ax.figure
