"""Chapter 05 plots: bytes per step on a log scale, final eval metrics, and the bucket_cap_mb sweep.

Every function takes what the chapter's script wrote (metrics rows, summaries,
``overlap.json``) and returns the matplotlib Figure.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ecomkit.parallel.compression.specs import parse_method_spec
from ecomlab.plots.common import _plt, finish_axes, train_rows


def plot_bytes_per_step(runs: Mapping[str, Sequence[dict]], ax=None):
    """Bytes each rank handed to collectives per optimizer step, log y axis.

    Methods whose per-step bytes are identical (fp16 and bf16, Top-K with and
    without error feedback at the same ratio, the guide's Top-K and ``none``)
    share one line and one legend entry, so nothing hides behind another line.
    PowerSGD's plain warm-up steps show as a step down from the dense level.
    """
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 4.2))
    groups: dict[tuple, list[str]] = {}
    steps: dict[tuple, list[int]] = {}
    for label, rows in runs.items():
        tr = [r for r in train_rows(rows) if r.get("comm_bytes")]
        if tr:
            key = tuple(r["comm_bytes"] for r in tr)
            groups.setdefault(key, []).append(label)
            steps[key] = [r["step"] for r in tr]
    for i, (key, labels) in enumerate(sorted(groups.items(), key=lambda kv: -max(kv[0]))):
        ax.plot(steps[key], list(key), ["-", "--", "-.", ":"][i % 4], lw=2, label=" = ".join(labels))
        ax.annotate(f"{key[-1]:,} B", (steps[key][-1], key[-1]), fontsize=7, xytext=(3, 0),
                    textcoords="offset points", va="center")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("bytes sent per rank per step")
    ax.set_title("communication per step (log scale); identical series share a line")
    ax.grid(alpha=0.3, which="both")
    ax.margins(x=0.15)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
    return fig or ax.figure


def plot_topk_losses(runs_by_spec: Mapping[str, Sequence[dict]], baseline: str = "none", ax=None):
    """Training loss of the Top-K runs: colour = ratio, solid = error feedback, dashed = none; black = baseline.

    ``runs_by_spec`` is keyed by method spec (``topk:0.01``, ``topk:0.01:noef``,
    ``topk_naive:0.25``, ``none``).
    """
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4.2))
    colours: dict[float, str] = {}
    palette = ["#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
    for text, rows in runs_by_spec.items():
        spec = parse_method_spec(text)
        tr = train_rows(rows)
        if spec.method == baseline:
            style = {"color": "k", "ls": "-", "lw": 2.2}
        elif spec.method == "topk":
            colour = colours.setdefault(spec.ratio, palette[len(colours) % len(palette)])
            style = {"color": colour, "ls": "-" if spec.error_feedback else "--", "lw": 1.6}
        elif spec.method == "topk_naive":
            style = {"color": "grey", "ls": ":", "lw": 2.2}
        else:
            continue
        ax.plot([r["step"] for r in tr], [r["loss"] for r in tr], label=spec.title, **style)
    finish_axes(ax, "optimizer step", "training loss", "Top-K: solid = error feedback, dashed = without", legend_size=7)
    return fig or ax.figure


def plot_final_metrics(summaries: Mapping[str, dict], keys: Sequence[str] = ("eval_loss", "acc_category",
                                                                            "acc_sentiment")):
    """One panel per metric, one bar per method, the dense baseline's value as a dashed line."""
    plt = _plt()
    keys = [k for k in keys if any(k in s for s in summaries.values())]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 4.2), squeeze=False)
    labels = list(summaries)
    for ax, key in zip(axes[0], keys):
        vals = [summaries[m].get(key, float("nan")) for m in labels]
        ax.barh(labels, vals, color="#4C72B0")
        ax.axvline(vals[0], color="k", ls="--", lw=1)  # the first entry is the baseline
        for y, v in enumerate(vals):
            ax.annotate(f"{v:.3f}", (v, y), va="center", fontsize=7, xytext=(2, 0), textcoords="offset points")
        ax.set_title(f"final {key}")
        ax.invert_yaxis()
        ax.margins(x=0.2)
    fig.tight_layout()
    return fig


def plot_bucket_sweep(sweep: Sequence[dict], ax=None):
    """Step time against bucket size, with compute-only and compute + serial communication for reference.

    The gap between the dotted line (nothing overlapped) and the solid one
    (DDP) is the communication hidden behind backward.
    """
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.8))
    caps = [r["bucket_cap_mb"] for r in sweep]
    ms = lambda key: [1000 * r[key] for r in sweep]  # noqa: E731
    ax.plot(caps, ms("step_s"), "o-", label="DDP step (overlapped all-reduce)")
    ax.plot(caps, ms("compute_s"), "s--", label="compute only (no_sync)")
    ax.plot(caps, [1000 * (r["compute_s"] + r["comm_s"]) for r in sweep], "^:", label="compute + all-reduce, serial")
    for r in sweep:
        if r.get("hidden_frac") is not None:
            ax.annotate(f"{r['n_buckets']} buckets\n{100 * r['hidden_frac']:.0f}% hidden",
                        (r["bucket_cap_mb"], 1000 * r["step_s"]), fontsize=7, xytext=(0, 8),
                        textcoords="offset points", ha="center")
    ax.set_xscale("log")
    finish_axes(ax, "bucket_cap_mb", "ms per forward + backward", "how much all-reduce DDP hides behind backward",
                grid="both")
    ax.margins(y=0.25)
    return fig or ax.figure
