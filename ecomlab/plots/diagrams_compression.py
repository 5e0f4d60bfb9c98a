"""Chapter 05's diagram: Top-K with error feedback over three steps, drawn from the library's own selection.

Why a diagram drawn by code: a reader of chapter 05 should see what one rank sends and what it keeps before
reading the hook, and the picture should not drift from the code. The numbers in the cells are a small
gradient (12 entries, a fixed seed) run through :func:`ecomkit.parallel.compression.topk.error_feedback_step`,
the function ``topk_hook`` calls; the bytes on the right are counted from the message it would send.

Redraw with ``python -m ecomlab.plots.diagrams_compression`` (writes ``notebooks/figures/topk_error_feedback.png``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ecomkit.parallel.compression.topk import error_feedback_step
from ecomlab.plots.common import FIGURES, _plt, redraw_main, save_figures

TOPK_FIGURE = "topk_error_feedback.png"
N_ENTRIES, RATIO, STEPS, SEED = 12, 0.25, 3, 5
SENT, KEPT, EMPTY, NEW = "#e8743b", "#d9d9d9", "white", "#f2f2f2"
FILL = {"new": lambda sent: NEW, "sent": lambda sent: SENT if sent else KEPT, "residual": lambda sent: EMPTY if sent else KEPT}


def topk_steps(n: int = N_ENTRIES, ratio: float = RATIO, steps: int = STEPS, seed: int = SEED) -> list[dict[str, Any]]:
    """Per step: the new gradient, gradient + residual, the sent positions and the residual left behind."""
    g = torch.Generator().manual_seed(seed)
    residual, rows = None, []
    for _ in range(steps):
        grad = torch.randn(n, generator=g).mul_(10).round_().div_(10)
        accumulated = grad if residual is None else grad + residual
        values, indices, residual = error_feedback_step(grad, residual, ratio)
        rows.append({"grad": grad.tolist(), "accumulated": accumulated.tolist(), "sent": sorted(indices.tolist()),
                     "residual": residual.tolist(), "sent_bytes": values.numel() * 4 + indices.numel() * 4,
                     "dense_bytes": n * 4})
    return rows


def _strip(ax, y: float, numbers: list[float], sent: set[int], label: str, mode: str) -> None:
    """One row of numbered cells, filled by ``mode``: new (plain), sent (orange where sent), residual (emptied)."""
    for i, v in enumerate(numbers):
        face = FILL[mode](i in sent)
        ax.add_patch(_plt().Rectangle((i, y), 0.95, 0.8, facecolor=face, edgecolor="#555555", linewidth=0.6))
        ax.text(i + 0.475, y + 0.4, f"{v:+.1f}", ha="center", va="center", fontsize=7.5)
    ax.text(-0.3, y + 0.4, label, ha="right", va="center", fontsize=8.5)


def draw_topk_error_feedback(rows: list[dict[str, Any]] | None = None):
    """The figure: per step, gradient, gradient + residual (sent cells orange), residual kept for the next step."""
    rows = rows or topk_steps()
    plt = _plt()
    n = len(rows[0]["grad"])
    fig, ax = plt.subplots(figsize=(11, 1.1 + 1.55 * len(rows)))
    for s, row in enumerate(rows):
        top = (len(rows) - 1 - s) * 4.2
        sent = set(row["sent"])
        ax.text(-6.2, top + 3.05, f"step {s + 1}", fontsize=10, fontweight="bold", va="center")
        _strip(ax, top + 2.6, row["grad"], sent, "new gradient", "new")
        _strip(ax, top + 1.6, row["accumulated"], sent, "gradient + residual", "sent")
        _strip(ax, top + 0.6, row["residual"], sent, "residual kept", "residual")
        ax.text(n + 0.4, top + 2.0, f"sent: {len(sent)} values + {len(sent)} int32 indices\n"
                f"= {row['sent_bytes']} B (dense fp32: {row['dense_bytes']} B)", fontsize=8.5, va="center")
    ax.set_xlim(-6.4, n + 6.2)
    ax.set_ylim(0.3, len(rows) * 4.2 - 0.6)
    ax.axis("off")
    ax.set_title(f"Top-K with error feedback on one rank (k = {RATIO:.0%} of {n}): the largest |gradient + residual| "
                 "are sent (orange), the rest waits", fontsize=10)
    fig.tight_layout()
    return fig


def redraw(folder: Path = FIGURES) -> list[Path]:
    """Write every diagram of this module into ``folder``; returns the files written."""
    return save_figures(folder, {TOPK_FIGURE: draw_topk_error_feedback}, dpi=110, metadata={"Software": None})


def main(argv: list[str] | None = None) -> None:
    redraw_main("Redraw chapter 05's diagrams into notebooks/figures/.", redraw, argv)


if __name__ == "__main__":
    main()
