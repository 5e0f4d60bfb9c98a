"""Chapter 04's diagrams: one MLP split by tensor parallelism, and the GPipe vs 1F1B pipeline schedules.

Why drawn by code: the TP picture carries the local shapes of the chapter's model (``TP``), and the schedules
are simulated from the stage and micro-batch counts the chapter runs (``PIPELINE``), so the bubble in the
picture is the bubble of the run. Redraw with
``python -m ecomlab.plots.diagrams_mixed`` (writes into ``notebooks/figures/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ecomlab.plots.common import FIGURES, _plt, redraw_main, save_figures

TP_FIGURE = "tp_split.png"
PIPELINE_FIGURE = "pipeline_schedules.png"
PIPELINE = {"stages": 2, "microbatches": 4}   # chapter 04's PP run: --pp 2 --parallel-pp-microbatches 4
TP = {"hidden": 64, "tp": 2}                  # chapter 04's model (tiny: hidden 64) and its --tp 2
RANK_COLORS = ("#4C72B0", "#DD8452")


# ---------------------------------------------------------------------- pipeline schedules
def stage_order(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """The order in which one stage runs its forwards ("F", k) and backwards ("B", k).

    GPipe: every forward, then every backward. 1F1B: ``stages - stage - 1`` warm-up forwards, then one
    forward and one backward in turn, then the remaining backwards, so a stage keeps at most
    ``stages - stage`` micro-batches' activations instead of all of them.
    """
    if schedule == "gpipe":
        return [("F", k) for k in range(microbatches)] + [("B", k) for k in range(microbatches)]
    warm = min(stages - stage - 1, microbatches)
    order = [("F", k) for k in range(warm)]
    for i in range(microbatches - warm):
        order += [("F", warm + i), ("B", i)]
    return order + [("B", k) for k in range(microbatches - warm, microbatches)]


def simulate(schedule: str, stages: int, microbatches: int, f_time: float = 1.0,
             b_time: float = 2.0) -> dict[str, Any]:
    """Start times of every (stage, op, micro-batch) when each op waits for its input; makespan and bubble.

    A forward on stage s needs stage s-1's forward of the same micro-batch; a backward needs stage s+1's
    backward (or, on the last stage, its own forward). The bubble is the idle share of each stage's time.
    """
    orders = [stage_order(schedule, s, stages, microbatches) for s in range(stages)]
    end: dict[tuple[int, str, int], float] = {}
    ops: list[dict[str, Any]] = []
    clock, nxt = [0.0] * stages, [0] * stages
    while any(nxt[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if nxt[s] == len(orders[s]):
                continue
            kind, k = orders[s][nxt[s]]
            dep = (s - 1, "F", k) if kind == "F" else ((s + 1, "B", k) if s < stages - 1 else (s, "F", k))
            if kind == "F" and s == 0:
                dep = None
            if dep is not None and dep not in end:
                continue
            start = max(clock[s], end[dep] if dep else 0.0)
            clock[s] = end[(s, kind, k)] = start + (f_time if kind == "F" else b_time)
            ops.append({"stage": s, "kind": kind, "mb": k, "start": start, "end": clock[s]})
            nxt[s] += 1
            progressed = True
        if not progressed:
            raise ValueError(f"{schedule} deadlocks with {stages} stages and {microbatches} micro-batches")
    makespan = max(clock)
    busy = microbatches * (f_time + b_time)
    in_flight = [_peak_in_flight([o for o in ops if o["stage"] == s]) for s in range(stages)]
    return {"schedule": schedule, "ops": ops, "makespan": makespan, "bubble": 1 - busy / makespan,
            "peak_in_flight": in_flight}


def _peak_in_flight(ops: list[dict[str, Any]]) -> int:
    """Most micro-batches whose activations one stage holds at once (forward done, backward not yet)."""
    live = peak = 0
    for op in sorted(ops, key=lambda o: o["start"]):
        live += 1 if op["kind"] == "F" else -1
        peak = max(peak, live)
    return peak


def draw_pipeline_schedules(stages: int, microbatches: int):
    """GPipe above 1F1B: one row per stage, forward boxes light, backward boxes dark, numbered by micro-batch."""
    plt = _plt()
    fig, axes = plt.subplots(2, 1, figsize=(11, 1.1 * 2 * stages + 2.2), sharex=True)
    sims = [simulate(s, stages, microbatches) for s in ("gpipe", "1f1b")]
    for ax, sim in zip(axes, sims):
        for op in sim["ops"]:
            color = "#9ecae1" if op["kind"] == "F" else "#3182bd"
            ax.add_patch(plt.Rectangle((op["start"], op["stage"] - 0.4), op["end"] - op["start"], 0.8,
                                       facecolor=color, edgecolor="black", lw=0.8))
            ax.text((op["start"] + op["end"]) / 2, op["stage"], f"{op['kind']}{op['mb']}", ha="center",
                    va="center", fontsize=10, color="black" if op["kind"] == "F" else "white")
        name = "GPipe" if sim["schedule"] == "gpipe" else "1F1B"
        ax.set_title(f"{name}: {stages} stages, {microbatches} micro-batches — idle (white) "
                     f"{100 * sim['bubble']:.0f} % of each stage's time; activations held at most: "
                     f"{', '.join(f'stage {s}: {p}' for s, p in enumerate(sim['peak_in_flight']))}", fontsize=10)
        ax.set_yticks(range(stages), [f"stage {s}" for s in range(stages)])
        ax.set_ylim(stages - 0.5, -0.5)
        ax.set_xlim(0, max(s["makespan"] for s in sims))
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel("time (a forward = 1 unit, a backward = 2 units); F3 = forward of micro-batch 3, "
                        "B3 = its backward")
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------- tensor-parallel split
def _box(ax, plt, x, y, w, h, color, text, fill=True):
    ax.add_patch(plt.Rectangle((x, y), w, h, facecolor=color if fill else "white", edgecolor="black", lw=1,
                               alpha=0.85 if fill else 1))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8.5,
            color="white" if fill and color != "#DDDDDD" else "black")


def draw_tp_split(hidden: int, tp: int):
    """An MLP ``h → 4h → h`` on ``tp`` ranks: column-parallel first layer, row-parallel second, one all-reduce."""
    plt = _plt()
    w1, w2 = (4 * hidden // tp, hidden), (hidden, 4 * hidden // tp)   # a rank's rows of W1 and columns of W2
    fig, ax = plt.subplots(figsize=(12, 2.2 * tp + 1.6))
    grey = "#DDDDDD"
    for r in range(tp):
        y = (tp - 1 - r) * 2.2
        c = RANK_COLORS[r % len(RANK_COLORS)]
        ax.text(-0.3, y + 0.75, f"rank {r}", ha="right", va="center", fontsize=11, fontweight="bold")
        _box(ax, plt, 0, y + 0.25, 1.6, 1.0, grey, f"X\n[tokens, {hidden}]\n(every rank)")
        ax.annotate("", (2.3, y + 0.75), (1.7, y + 0.75), arrowprops={"arrowstyle": "->"})
        _box(ax, plt, 2.4, y, 1.8, 1.5, c, f"W1 rows {r * w1[0]}–{(r + 1) * w1[0] - 1}\n"
             f"local [{w1[0]}, {w1[1]}]\n(column-parallel)")
        ax.annotate("", (4.9, y + 0.75), (4.3, y + 0.75), arrowprops={"arrowstyle": "->"})
        _box(ax, plt, 5.0, y + 0.25, 1.6, 1.0, c, f"gelu(X·W1ᵀ)\n[tokens, {w1[0]}]\nno comm.")
        ax.annotate("", (7.3, y + 0.75), (6.7, y + 0.75), arrowprops={"arrowstyle": "->"})
        _box(ax, plt, 7.4, y, 1.8, 1.5, c, f"W2 columns {r * w2[1]}–{(r + 1) * w2[1] - 1}\n"
             f"local [{w2[0]}, {w2[1]}]\n(row-parallel)")
        ax.annotate("", (9.9, y + 0.75), (9.3, y + 0.75), arrowprops={"arrowstyle": "->"})
        _box(ax, plt, 10.0, y + 0.25, 1.5, 1.0, c, f"partial Z{r}\n[tokens, {hidden}]")
    top = (tp - 1) * 2.2 + 1.5
    _box(ax, plt, 12.3, 0.25, 1.5, top - 0.5, grey, f"all-reduce\n(sum)\n\nZ = Σ Zr\n[tokens, {hidden}]\non every rank")
    for r in range(tp):
        ax.annotate("", (12.25, (tp - 1 - r) * 2.2 + 0.75), (11.55, (tp - 1 - r) * 2.2 + 0.75),
                    arrowprops={"arrowstyle": "->"})
    ax.set_xlim(-1.3, 14.0)
    ax.set_ylim(-0.3, top + 0.7)
    ax.set_title(f"Tensor parallel MLP (hidden {hidden}, tp {tp}): split W1 by output rows, W2 by input columns — "
                 f"one all-reduce per MLP forward", fontsize=11)
    ax.axis("off")
    fig.tight_layout()
    return fig


def draw_all(out_dir: Path = FIGURES) -> list[Path]:
    """Redraw chapter 04's diagrams into ``out_dir``; return the files written."""
    return save_figures(out_dir, {TP_FIGURE: lambda: draw_tp_split(TP["hidden"], TP["tp"]),
                                  PIPELINE_FIGURE: lambda: draw_pipeline_schedules(PIPELINE["stages"],
                                                                                   PIPELINE["microbatches"])})


def main(argv: list[str] | None = None) -> None:
    redraw_main("Redraw chapter 04's tensor-parallel and pipeline diagrams.", draw_all, argv)


if __name__ == "__main__":
    main()
