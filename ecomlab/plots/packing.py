"""Chapter 02's packing plots: where a step's positions go, and the mask that keeps packed rows apart."""

from __future__ import annotations

from typing import Mapping

import torch

from ecomkit.models.attention import document_causal_mask
from ecomlab.plots.common import _plt, plot_throughput_bars


def plot_packing_comparison(summaries: Mapping[str, dict], title: str = "bucketed rows against packed sequences"):
    """Three panels from run summaries: fill rate, real tokens per step, real tokens/s (ratio to the first run)."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    names = list(summaries)
    fill = {n: 100 * summaries[n]["fill_rate"] for n in names}
    per_step = {n: summaries[n]["tokens_per_s"] * summaries[n]["steady_wall_s"] / summaries[n]["steady_steps"]
                for n in names}
    rate = {n: summaries[n]["tokens_per_s"] for n in names}
    plot_throughput_bars(fill, ylabel="% of positions that are real tokens", title="fill rate", ax=axes[0])
    plot_throughput_bars(per_step, ylabel="real tokens per optimizer step", title="work per step",
                         baseline=names[0], ax=axes[1])
    plot_throughput_bars(rate, ylabel="real tokens/s", title="throughput", baseline=names[0], ax=axes[2])
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_document_mask(document_ids: torch.Tensor, title: str = "who may attend to whom in one packed sequence"):
    """The document ids of one packed sequence over its block-diagonal causal mask (white: attends)."""
    plt = _plt()
    docs = document_ids.reshape(1, -1)
    allowed = (document_causal_mask(docs)[0, 0] == 0).float().numpy()
    fig, (strip, ax) = plt.subplots(2, 1, figsize=(5.5, 6), gridspec_kw={"height_ratios": [1, 12]}, sharex=True)
    strip.imshow(docs.numpy(), aspect="auto", cmap="tab20", interpolation="nearest")
    strip.set_yticks([])
    strip.set_title(f"{title}\nrow ids (0 = padding)", fontsize=9)
    ax.imshow(allowed, cmap="gray", interpolation="nearest", aspect="auto")
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    fig.tight_layout()
    return fig


__all__ = ["plot_document_mask", "plot_packing_comparison"]
