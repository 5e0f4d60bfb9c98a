"""Chapter 03 plots: per-rank model-state memory by ZeRO stage, and formula extrapolations."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ecomlab.plots.common import _plt

COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "buffers": "#BBBBBB"}
MIB = 2**20


def plot_memory_stacked(rows: Sequence[Mapping[str, Any]], ax=None, unit: float = MIB, unit_name: str = "MiB"):
    """Stacked bars (params, grads, optimizer; comm buffers hatched on top) per variant, formula as a black tick.

    ``rows`` come from :func:`ecomlab.measure.zero.memory_row` (largest rank of each run).
    """
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 4))
    labels = [r["label"] for r in rows]
    bottom = [0.0] * len(rows)
    for cat in ("params", "grads", "optimizer", "buffers"):
        vals = [r["measured"].get(cat, 0) / unit for r in rows]
        ax.bar(labels, vals, bottom=bottom, color=COLORS[cat], label=cat if cat != "buffers" else "comm buffers",
               hatch="//" if cat == "buffers" else None, edgecolor="white")
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, r in enumerate(rows):
        ax.plot([i - 0.4, i + 0.4], [r["formula"]["total"] / unit] * 2, color="black", lw=2,
                label="formula (params+grads+optimizer)" if i == 0 else None)
        ax.annotate(r["formula_label"], (i, r["formula"]["total"] / unit), xytext=(0, 3),
                    textcoords="offset points", ha="center", fontsize=7)
    ax.set_ylabel(f"bytes per rank ({unit_name})")
    ax.set_title("model states held by one rank (measured by counting tensors)")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    return fig or ax.figure


def plot_extrapolation(tables: Mapping[str, Sequence[Mapping[str, Any]]], ax=None, limit_gb: float | None = None):
    """Grouped bars: per-GPU model-state GB by stage, one group per (model, world size); optional GPU-size line."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 4))
    groups = [(model, n) for model, rows in tables.items() for n in sorted({r["world_size"] for r in rows})]
    stages = sorted({r["stage"] for rows in tables.values() for r in rows})
    width = 0.8 / len(stages)
    for j, s in enumerate(stages):
        vals = [next(r["total"] for r in tables[m] if r["world_size"] == n and r["stage"] == s) / 1e9 for m, n in groups]
        xs = [i + (j - (len(stages) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, vals, width, label=f"stage {s}" if s else "DDP (stage 0)")
    ax.set_xticks(range(len(groups)), [f"{m}\n{n} GPUs" for m, n in groups], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("model states per GPU (GB, log)")
    if limit_gb:
        ax.axhline(limit_gb, color="red", ls="--", lw=1, label=f"{limit_gb:g} GB GPU")
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.set_title("mixed-precision Adam: 16Ψ, 4Ψ+12Ψ/N, 2Ψ+14Ψ/N, 16Ψ/N")
    return fig or ax.figure
