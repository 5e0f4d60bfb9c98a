"""Loss-curve overlays and bar charts shared by the chapters (matplotlib, returns the Figure)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, Mapping, Sequence


def _plt():
    """matplotlib.pyplot, imported on first plot so training runs never pay for it."""
    import matplotlib  # lazy: plotting only, keeps training processes free of matplotlib

    if matplotlib.get_backend().lower().startswith("qt"):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the backend choice above

    return plt


def finish_axes(ax, xlabel: str, ylabel: str, title: str, *, legend_size: int = 8, grid: str = "major"):
    """Labels, title, a light grid and the legend: the same finish on every chapter's line plot."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, which=grid)
    ax.legend(fontsize=legend_size)
    return ax


def train_rows(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r.get("type", "train") == "train"]


def plot_loss_curves(runs: Mapping[str, Sequence[dict]], key: str = "loss", title: str = "training loss",
                     eval_key: str | None = "eval_loss", ax=None):
    """Overlay per-step ``key`` for several runs; eval points as markers when present."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.8))
    styles = ["-", "--", ":", "-."]
    for i, (label, rows) in enumerate(runs.items()):
        tr = train_rows(rows)
        line, = ax.plot([r["step"] for r in tr], [r[key] for r in tr], styles[i % 4], label=label, lw=1.6)
        if eval_key:
            ev = [r for r in rows if eval_key in r]
            if ev:
                ax.plot([r["step"] for r in ev], [r[eval_key] for r in ev], "o", color=line.get_color(), ms=4)
    finish_axes(ax, "optimizer step", key, title)
    return fig or ax.figure


def plot_throughput_bars(values: Mapping[str, float], ylabel: str = "samples/s", title: str = "",
                         baseline: str | None = None, ax=None):
    """Bars with the value (and the ratio to ``baseline``) written on each bar."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 3.5))
    labels, vals = list(values), list(values.values())
    bars = ax.bar(labels, vals, color="#4C72B0")
    base = values.get(baseline) if baseline else None
    for b, v in zip(bars, vals):
        text = f"{v:.1f}" + (f"\n{v / base:.2f}×" if base else "")
        ax.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.margins(y=0.25)
    return fig or ax.figure


# Where the chapters' diagrams live: committed PNGs that notebooks show from markdown (ecomlab/plots/diagrams_*.py).
FIGURES = Path(__file__).resolve().parents[2] / "notebooks" / "figures"


def save_figures(out_dir: Path, draws: Mapping[str, Callable[[], object]], dpi: int = 100,
                 **savefig: object) -> list[Path]:
    """Draw each figure (``{file name: draw()}``), write it as ``out_dir/name`` and close it; the files written.

    One figure at a time, closed after writing, so that redrawing every chapter's diagrams holds one in memory."""
    plt = _plt()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in draws.items():
        fig = draw()
        fig.savefig(out_dir / name, dpi=dpi, **savefig)
        plt.close(fig)
        written.append(out_dir / name)
    return written


def redraw_main(description: str, draw_all: Callable[[Path], list[Path]], argv: list[str] | None = None) -> None:
    """``python -m ecomlab.plots.diagrams_<topic> [--out-dir DIR]``: redraw a chapter's diagrams, print their paths."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out-dir", type=Path, default=FIGURES, help="folder for the PNG files")
    for path in draw_all(parser.parse_args(argv).out_dir):
        print(path)
