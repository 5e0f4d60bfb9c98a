"""Chapter 05 plots: bytes per step on a log scale, final eval metrics, and the bucket_cap_mb sweep.

Every function takes what the chapter's script wrote (metrics rows, summaries,
``overlap.json``) and returns the matplotlib Figure.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .common import _plt, train_rows


def plot_bytes_per_step(runs: Mapping[str, Sequence[dict]], ax=None):
    """Bytes each rank handed to collectives per optimizer step, one line per method, log y axis.

    The dashed grey line is the dense fp32 figure (what ``none`` sends).
    Steps where PowerSGD still runs its plain warm-up all-reduce show as a
    step up to the dense line.
    """
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(8, 4.2))
    dense_drawn = False
    for i, (label, rows) in enumerate(runs.items()):
        tr = [r for r in train_rows(rows) if r.get("comm_bytes")]
        if not tr:
            continue
        ax.plot([r["step"] for r in tr], [r["comm_bytes"] for r in tr], ["-", "--", ":", "-."][i % 4],
                label=label, lw=1.6)
        if not dense_drawn:
            ax.plot([r["step"] for r in tr], [r["comm_bytes_dense"] for r in tr], color="grey", lw=4, alpha=0.3,
                    label="dense fp32 (reference)")
            dense_drawn = True
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("bytes sent per rank per step")
    ax.set_title("communication per step (log scale)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2, loc="lower right")
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
            ax.annotate(f"{r['n_buckets']} bkt\n{100 * r['hidden_frac']:.0f}% hidden",
                        (r["bucket_cap_mb"], 1000 * r["step_s"]), fontsize=7, xytext=(0, 8),
                        textcoords="offset points", ha="center")
    ax.set_xscale("log")
    ax.set_xlabel("bucket_cap_mb")
    ax.set_ylabel("ms per forward + backward")
    ax.set_title("how much all-reduce DDP hides behind backward")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.margins(y=0.25)
    return fig or ax.figure
