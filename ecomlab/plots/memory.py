"""Chapter 06 plots: planned memory breakdowns, measured vs predicted bytes, checkpointing, speed-up claims."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ecomkit.hardware import GIB
from ecomlab.plots.common import _plt, finish_axes

PART_COLORS = {
    "parameters": "#4C72B0", "gradients": "#55A868", "optimizer states": "#C44E52",
    "activations (blocks)": "#8172B2", "activations (attention scores)": "#CCB974",
    "activations (embedding + LM head)": "#64B5CD", "temporary (logits / backward layer)": "#DD8452",
    "temporary (comm buffers)": "#937860", "temporary (autocast weight copies)": "#DA8BC3", "CUDA context": "#8C8C8C",
}


def plot_memory_breakdown(plans: Mapping[str, Any], capacity_bytes: float | None = None, title: str = "",
                          ax=None):
    """Stacked bars (GiB per GPU) of each plan's parts; a dashed line at the GPU's capacity."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(plans) + 3), 4))
    labels = list(plans)
    breakdowns = [p.breakdown() if hasattr(p, "breakdown") else dict(p) for p in plans.values()]
    bottoms = [0.0] * len(labels)
    for part, color in PART_COLORS.items():
        vals = [b.get(part, 0) / GIB for b in breakdowns]
        if any(vals):
            ax.bar(labels, vals, bottom=bottoms, color=color, label=part, width=0.6)
            bottoms = [x + v for x, v in zip(bottoms, vals)]
    for i, total in enumerate(bottoms):
        ax.annotate(f"{total:.1f}", (i, total), ha="center", va="bottom", fontsize=8)
    if capacity_bytes:
        ax.axhline(capacity_bytes / GIB, ls="--", color="k", lw=1)
        ax.annotate(f"GPU {capacity_bytes / GIB:.0f} GiB", (len(labels) - 0.5, capacity_bytes / GIB),
                    ha="right", va="bottom", fontsize=8)
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(axis="x", labelsize=8)
    return fig or ax.figure


def plot_measured_vs_predicted(rows: Sequence[dict], x: str = "seq_len", measured: str = "measured_saved",
                               predicted: str = "predicted_saved", group: str | Sequence[str] = "mode",
                               scale: float = 2**20, unit: str = "MiB", title: str = "", ax=None):
    """Measured points and predicted lines against ``x``, one colour per value of ``group`` (a key or keys)."""
    plt = _plt()
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 4))
    keys = [group] if isinstance(group, str) else list(group)
    groups: dict[Any, list[dict]] = {}
    for r in rows:
        groups.setdefault(", ".join(str(r.get(k, "")) for k in keys), []).append(r)
    for name, rs in groups.items():
        rs = sorted(rs, key=lambda r: r[x])
        line, = ax.plot([r[x] for r in rs], [r[predicted] / scale for r in rs], "-", lw=1.2, label=f"{name} (planner)")
        ax.plot([r[x] for r in rs], [r[measured] / scale for r in rs], "o", color=line.get_color(), ms=5,
                label=f"{name} (measured)")
    finish_axes(ax, x, unit, title, legend_size=7)
    return fig or ax.figure


def plot_checkpointing(rows: Sequence[dict], title: str = "activation checkpointing"):
    """Left: saved bytes off/on per sequence length; right: step-time cost (on/off)."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    seqs = [str(r["seq_len"]) for r in rows]
    idx = range(len(rows))
    a1.bar([i - 0.2 for i in idx], [r["saved_off"] / 2**20 for r in rows], 0.4, label="off", color="#C44E52")
    a1.bar([i + 0.2 for i in idx], [r["saved_on"] / 2**20 for r in rows], 0.4, label="on", color="#55A868")
    for i, r in zip(idx, rows):
        a1.annotate(f"÷{r['measured_factor']:.1f}\n(pred ÷{r['predicted_factor']:.1f})", (i, r["saved_off"] / 2**20),
                    ha="center", va="bottom", fontsize=7)
    a1.set_xticks(list(idx), seqs)
    a1.set_xlabel("sequence length")
    a1.set_ylabel("saved for backward (MiB)")
    a1.legend(fontsize=8)
    a1.margins(y=0.3)
    a2.bar(seqs, [r["time_cost"] for r in rows], color="#4C72B0")
    a2.axhline(1, color="k", lw=0.8)
    a2.axhline(4 / 3, color="k", lw=0.8, ls=":")
    a2.annotate("4/3: one extra forward if backward = 2 × forward", (len(rows) - 0.5, 4 / 3), ha="right",
                va="bottom", fontsize=7)
    a2.set_ylim(0, max(1.5, 1.15 * max(r["time_cost"] for r in rows)))
    a2.set_xlabel("sequence length")
    a2.set_ylabel("step time, on / off")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_speedup_claims(rows: Sequence[dict], title: str = "guides' speed-ups vs the time model"):
    """Claimed speed-up (cross) and the predicted band (bar from low to high, dot at the central value)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.5))
    for i, r in enumerate(rows):
        ax.plot([r["predicted_low"], r["predicted_high"]], [i, i], "-", color="#4C72B0", lw=6, alpha=0.4)
        ax.plot(r["predicted"], i, "o", color="#4C72B0")
        ax.plot(r["claimed_speedup"], i, "x", color="#C44E52", ms=9, mew=2)
        ax.plot(r["gpus"], i, "|", color="k", ms=14)
    ax.set_yticks(range(len(rows)), [r["claim"] for r in rows], fontsize=7)
    ax.set_xlabel("speed-up over 1 GPU  (x = claimed, ● = predicted, band = assumptions, | = N)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    ax.invert_yaxis()
    fig.tight_layout()
    return fig


def plot_state_comparison(rows: Sequence[dict], title: str = "model states per rank: planned vs measured"):
    """Grouped bars per strategy and rank: measured total next to planned total (bytes)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels = [f"{r['strategy']}\nrank {r['rank']}" for r in rows]
    idx = range(len(rows))
    ax.bar([i - 0.2 for i in idx], [r["measured_total"] / 1e6 for r in rows], 0.4, label="measured", color="#4C72B0")
    ax.bar([i + 0.2 for i in idx], [r["planned_total"] / 1e6 for r in rows], 0.4, label="planned", color="#DD8452")
    ax.set_xticks(list(idx), labels, fontsize=7)
    ax.set_ylabel("MB per rank")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return fig


def format_state_comparison(rows: Sequence[dict]) -> str:
    """One line per strategy and rank: measured model-state bytes, planned bytes, and the difference."""
    return "\n".join(f"{r['strategy']:>6} rank {r['rank']}: measured {r['measured_total']:>9,} B, "
                     f"planned {r['planned_total']:>9,} B, difference {r['difference_bytes']:+,} B" for r in rows)


def format_calibration(report: dict) -> str:
    """The measured inputs, then one line per strategy: predicted and measured step time, and their ratio."""
    c, lk = report["compute"], report["link"]
    lines = [f"measured inputs ({report['world_size']} processes): forward+backward {1000 * c['fwd_bwd_s']:.1f} ms, "
             f"AdamW on {c['n_params']:,} parameters {1000 * c['optimizer_s']:.1f} ms"]
    lines += [f"  {name} on one rank: forward+backward {1000 * c[f'{key}_fwd_bwd_s']:.1f} ms, "
              f"step {1000 * c[f'{key}_optimizer_s']:.1f} ms"
              for name, key in (("FSDP2", "fsdp"), ("ZeRO-2 engine", "zero")) if c.get(f"{key}_fwd_bwd_s")]
    lines += [f"  gloo {kind}: α {1e6 * alpha:.0f} µs, bus bandwidth {bus / 1e9:.2f} GB/s"
              for kind, (alpha, bus) in lk["fits"].items()]
    lines += [f"{r['strategy']:>6} × {r['processes']}: predicted {1000 * r['predicted_s']:7.1f} ms "
              f"(compute {1000 * r['compute_s']:.1f}, comm {1000 * r['comm_exposed_s']:.1f}, optimizer "
              f"{1000 * r['optimizer_s']:.1f}), measured {1000 * r['measured_s']:7.1f} ms, "
              f"predicted/measured {r['ratio']:.2f}" for r in report["rows"]]
    return "\n".join(lines)


__all__ = ["format_calibration", "format_state_comparison", "plot_memory_breakdown", "plot_measured_vs_predicted",
           "plot_checkpointing", "plot_speedup_claims", "plot_state_comparison", "PART_COLORS"]
