"""Chapter 03's diagram: what each rank holds under ZeRO stages 0-3, drawn from the planner's bytes for a real model.

Why drawn by code: the picture carries real quantities (Ψ of SeqGPT-560M built on the meta device, the
per-rank bytes of :func:`ecomkit.planner.zero_formulas.formula_bytes`), so it cannot drift from the
formulas the chapter asserts. Redraw with ``python -m ecomlab.plots.diagrams_zero`` (writes
``notebooks/figures/zero_partitioning.png``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ecomkit.models.bloom import preset_parameter_count
from ecomkit.planner.zero_formulas import formula_bytes
from ecomlab.plots.common import FIGURES, _plt, redraw_main, save_figures

ZERO_FIGURE = "zero_partitioning.png"
# mixed-precision Adam, bytes per parameter: bf16 weight, bf16 gradient, fp32 master + momentum + variance
SEGMENTS = (("params", 2, "#4C72B0", 3), ("grads", 2, "#DD8452", 2), ("optimizer", 12, "#55A868", 1))
GB = 1e9


def zero_partition_quantities(model: str = "seqgpt-560m", world_size: int = 4) -> dict[str, Any]:
    """Ψ of ``model`` and, for stages 0-3, the per-rank bytes the planner's formulas give (mixed precision)."""
    psi = preset_parameter_count(model)
    return {"model": model, "psi": psi, "world_size": world_size,
            "stages": {s: formula_bytes(s, psi, world_size) for s in range(4)}}


def _held(stage: int, first_partitioned: int) -> bool:
    """Stage s partitions the optimizer (s≥1), then gradients (s≥2), then parameters (s≥3)."""
    return stage < first_partitioned


def draw_zero_partitioning(q: dict[str, Any]):
    """One bar per (stage, rank): the 16 bytes of every parameter, filled where this rank holds them."""
    plt = _plt()
    n, psi = q["world_size"], q["psi"]
    fig, ax = plt.subplots(figsize=(11, 0.4 * 4 * (n + 1.5) + 1.4))
    y = 0.7
    yticks, ylabels = [], []
    for stage in range(4):
        for rank in range(n):
            x = 0.0
            for name, nbytes, color, first_partitioned in SEGMENTS:
                width = nbytes * psi / GB
                for j in range(n):
                    held = _held(stage, first_partitioned) or j == rank
                    ax.add_patch(plt.Rectangle((x + j * width / n, y), width / n, 0.8, facecolor=color if held
                                               else "white", edgecolor=color, lw=0.8, alpha=1 if held else 0.6))
                x += width
            yticks.append(y + 0.4)
            ylabels.append(f"rank {rank}")
            if rank == 0:
                total = q["stages"][stage]["total"] / GB
                label = "stage 0 (DDP)" if stage == 0 else f"stage {stage}"
                ax.text(0, y - 0.12, label, ha="left", va="bottom", fontsize=11, fontweight="bold")
                ax.text(16 * psi / GB * 1.01, y + 0.4 + (n - 1) / 2, f"{total:.2f} GB\nper rank", va="center",
                        fontsize=10)
            y += 1
        y += 1.5
    for name, nbytes, color, _ in SEGMENTS:
        ax.add_patch(plt.Rectangle((0, 0), 0, 0, facecolor=color, label=f"{name} ({nbytes} B/param)"))
    ax.add_patch(plt.Rectangle((0, 0), 0, 0, facecolor="white", edgecolor="grey", label="held by another rank"))
    ax.set_xlim(0, 16 * psi / GB * 1.12)
    ax.set_ylim(y - 1.2, -0.2)
    ax.set_yticks(yticks, ylabels, fontsize=8)
    ax.set_xlabel(f"GB of model states, laid out as 16 B × Ψ  (Ψ = {psi:,} parameters)")
    ax.set_title(f"ZeRO on {n} ranks, {q['model']}: what each rank holds (filled) — bytes from the planner's formulas")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=4, fontsize=9, frameon=False)
    ax.spines[["top", "right", "left"]].set_visible(False)
    fig.subplots_adjust(left=0.08, right=0.97, top=0.94, bottom=0.14)
    return fig


def draw_all(out_dir: Path = FIGURES) -> list[Path]:
    """Redraw chapter 03's diagrams into ``out_dir``; return the files written."""
    return save_figures(out_dir, {ZERO_FIGURE: lambda: draw_zero_partitioning(zero_partition_quantities())})


def main(argv: list[str] | None = None) -> None:
    redraw_main("Redraw chapter 03's ZeRO partitioning diagram.", draw_all, argv)


if __name__ == "__main__":
    main()
