"""Diagrams of chapters 01 and 02, drawn by code: the ring all-reduce, and DDP's buckets overlapping backward.

Why drawn by code: the pictures show the real quantities of the lesson, not a sketch that can drift from
it. The ring is drawn for the world size and message of chapter 01's hand-written ring all-reduce (its
chunk sizes are ``torch.tensor_split``'s, as in the lesson); the buckets are the ones DDP itself computes for
a model built from ecomkit's presets (``torch.distributed._compute_bucket_assignment_by_size``, the function
``DistributedDataParallel`` calls, with the limits it uses for an explicit ``bucket_cap_mb``, as ecomkit passes).

Redraw the committed PNGs (``notebooks/figures/``) with ``python -m ecomlab.plots.diagrams_ddp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ecomkit.models.bloom import build_model
from ecomlab.plots.common import FIGURES, _plt, redraw_main, save_figures

RING_WORLD_SIZE = 3           # chapter 01's hand-written ring runs on 3 processes: n = 2 would hide the ring
RING_NUMEL = 3 * 4096         # its message: 12,288 float32 values (48 KiB) per rank
OVERLAP_CASES = (("tiny", 25.0), ("small", 25.0), ("small", 4.0))   # (preset, bucket_cap_mb) rows of the figure
OVERLAP_VOCAB = 4003          # the `local` tokenizer's vocabulary, which chapter 02's runs train with
COMM_PER_BACKWARD = 0.6       # assumed: all-reducing the whole gradient takes 0.6 × the backward pass
CALL_LATENCY = 0.02           # assumed: each all-reduce call costs 2 % of the backward pass before any byte moves


# ------------------------------------------------------------------ ring all-reduce
@dataclass(frozen=True)
class RingTransfer:
    """One step's message: rank ``src`` sends chunk ``chunk`` to its right neighbour ``dst``."""

    phase: str     # "reduce-scatter" (the receiver adds) or "all-gather" (the receiver copies)
    step: int
    src: int
    dst: int
    chunk: int


def ring_schedule(n: int) -> list[list[RingTransfer]]:
    """The 2(n−1) steps of a ring all-reduce: in each, every rank sends one chunk to the next rank.

    Reduce-scatter step s: rank r sends chunk (r − s) mod n, which the next rank adds to its own; after n−1
    steps rank r holds the full sum of chunk (r + 1) mod n. All-gather step s: rank r sends chunk
    (r + 1 − s) mod n, which the next rank copies, so after n−1 more steps every rank holds every sum.
    """
    steps = []
    for s in range(n - 1):
        steps.append([RingTransfer("reduce-scatter", s, r, (r + 1) % n, (r - s) % n) for r in range(n)])
    for s in range(n - 1):
        steps.append([RingTransfer("all-gather", s, r, (r + 1) % n, (r + 1 - s) % n) for r in range(n)])
    return steps


def ring_contributions(n: int) -> list[list[list[frozenset[int]]]]:
    """For the start and after each step: which ranks' data each rank's copy of each chunk holds."""
    held = [[frozenset({r}) for _ in range(n)] for r in range(n)]
    states = [held]
    for transfers in ring_schedule(n):
        new = [list(row) for row in held]
        for t in transfers:
            if t.phase == "reduce-scatter":
                new[t.dst][t.chunk] = held[t.dst][t.chunk] | held[t.src][t.chunk]
            else:
                new[t.dst][t.chunk] = held[t.src][t.chunk]
        held = new
        states.append(held)
    return states


def ring_chunk_bytes(n: int = RING_WORLD_SIZE, numel: int = RING_NUMEL, itemsize: int = 4) -> list[int]:
    """Bytes of each chunk, split as ``torch.tensor_split`` splits the message."""
    return [c.numel() * itemsize for c in torch.tensor_split(torch.empty(numel, device="meta"), n)]


def ring_bytes_sent(n: int = RING_WORLD_SIZE, numel: int = RING_NUMEL, itemsize: int = 4) -> list[int]:
    """Bytes each rank sends over the whole all-reduce: 2(n−1)/n of the message when chunks are equal."""
    sizes = ring_chunk_bytes(n, numel, itemsize)
    sent = [0] * n
    for transfers in ring_schedule(n):
        for t in transfers:
            sent[t.src] += sizes[t.chunk]
    return sent


def draw_ring_allreduce(n: int = RING_WORLD_SIZE, numel: int = RING_NUMEL):
    """One panel per state: ranks as rows, chunks as columns, shade = share of ranks summed in; arrows = sends."""
    plt = _plt()
    from matplotlib.patches import FancyArrowPatch, Rectangle  # lazy: plotting only, as pyplot

    states, schedule = ring_contributions(n), ring_schedule(n)
    sizes = ring_chunk_bytes(n, numel)
    sent = ring_bytes_sent(n, numel)
    cmap = plt.get_cmap("Blues")
    fig, axes = plt.subplots(1, len(states), figsize=(2.35 * len(states), 3.4))
    for k, ax in enumerate(axes):
        state = states[k]
        for r in range(n):
            for c in range(n):
                share = len(state[r][c]) / n
                ax.add_patch(Rectangle((c, n - 1 - r), 0.92, 0.86, color=cmap(0.15 + 0.75 * share)))
                label = "Σ" if share == 1 else "+".join(str(i) for i in sorted(state[r][c]))
                ax.text(c + 0.46, n - 1 - r + 0.43, label, ha="center", va="center", fontsize=9,
                        color="white" if share > 0.6 else "black")
        if k > 0:   # the step that led here: each rank's send to its right neighbour
            for t in schedule[k - 1]:
                y0, y1 = n - 1 - t.src + 0.43, n - 1 - t.dst + 0.43
                rad = 0.35 if t.dst > t.src else -0.6
                ax.add_patch(FancyArrowPatch((t.chunk + 0.85, y0), (t.chunk + 0.85, y1), arrowstyle="-|>",
                                             mutation_scale=10, color="#d62728", lw=1.2,
                                             connectionstyle=f"arc3,rad={rad}"))
        ax.set_xlim(-0.05, n + 0.15)
        ax.set_ylim(-0.1, n)
        ax.set_xticks([c + 0.46 for c in range(n)], [f"chunk {c}" for c in range(n)], fontsize=8)
        ax.set_yticks([n - 1 - r + 0.43 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=8)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        if k == 0:
            ax.set_title("start: own data", fontsize=9)
        else:
            t0 = schedule[k - 1][0]
            ax.set_title(f"{t0.phase}\nstep {t0.step + 1} of {n - 1}", fontsize=9)
    total = sum(sizes)
    fig.suptitle(f"Ring all-reduce, n = {n} ranks, a {total / 1024:.0f} KiB message in chunks of "
                 f"{', '.join(f'{s / 1024:.0f}' for s in sizes)} KiB: each rank sends {sent[0] / 1024:.0f} KiB "
                 f"= 2(n−1)/n × message = {2 * (n - 1) / n:.2f} ×", fontsize=10)
    fig.text(0.5, 0.01, "cell label: the ranks whose data the copy holds (Σ: all of them); red arrow: a rank "
             "sends that chunk to its right neighbour (reduce-scatter adds, all-gather copies)",
             ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 0.9))
    return fig


# ------------------------------------------------------------------ DDP buckets
@dataclass(frozen=True)
class Bucket:
    """One DDP gradient bucket: its bytes, and how many parameters (of the model's total) it holds."""

    index: int
    nbytes: int
    n_params: int
    first_param: str     # in backward order: the gradient that opens the bucket


def ddp_buckets(model: torch.nn.Module, bucket_cap_mb: float | None) -> list[Bucket]:
    """The buckets DDP builds for ``model`` once it has seen one backward pass, in backward order.

    DDP (torch >= 2.8) puts every gradient in one bucket for the first iteration, then rebuilds its buckets in
    the order backward produced the gradients: for a model used in definition order, the parameters reversed.
    A bucket closes once it reaches ``bucket_cap_mb``. Only when ``bucket_cap_mb`` is left at its default
    (None here) is the first bucket capped at 1 MiB; ecomkit always passes ``--bucket-cap-mb``.
    """
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in reversed(named)]
    names = [n for n, _ in reversed(named)]
    cap = int((25.0 if bucket_cap_mb is None else bucket_cap_mb) * 2**20)
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, cap] if bucket_cap_mb is None else [cap]
    indices, _ = dist._compute_bucket_assignment_by_size(params, limits)
    return [Bucket(k, sum(params[i].numel() * params[i].element_size() for i in idx),
                   sum(params[i].numel() for i in idx), names[idx[0]])
            for k, idx in enumerate(sorted(indices, key=min))]   # backward order: the last parameters first


def overlap_timeline(buckets: list[Bucket], comm_per_backward: float = COMM_PER_BACKWARD,
                     call_latency: float = CALL_LATENCY) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(start, end) of each bucket's gradients in backward, and of its all-reduce, in units of one backward pass.

    A bucket's gradients take a share of backward proportional to its parameters; its all-reduce starts when
    its last gradient is ready and the previous all-reduce has finished (one communication stream), and takes
    ``call_latency`` plus its share of ``comm_per_backward`` by bytes: the α-β model, α the latency of a call
    and β the bandwidth.
    """
    total_params = sum(b.n_params for b in buckets)
    total_bytes = sum(b.nbytes for b in buckets)
    compute, comm, t, free = [], [], 0.0, 0.0
    for b in buckets:
        end = t + b.n_params / total_params
        compute.append((t, end))
        start = max(end, free)
        free = start + call_latency + comm_per_backward * b.nbytes / total_bytes
        comm.append((start, free))
        t = end
    return compute, comm


def draw_bucket_overlap(cases: tuple[tuple[str, float], ...] = OVERLAP_CASES, vocab_size: int = OVERLAP_VOCAB):
    """One timeline per (preset, bucket_cap_mb): backward's buckets above, their all-reduces below."""
    plt = _plt()
    colors = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(len(cases), 1, figsize=(10, 1.75 * len(cases) + 0.9), sharex=True)
    for ax, (preset, cap) in zip(axes, cases):
        buckets = ddp_buckets(build_model(preset, vocab_size=vocab_size, device="meta"), cap)
        compute, comm = overlap_timeline(buckets)
        for k, ((c0, c1), (a0, a1)) in enumerate(zip(compute, comm)):
            color = colors[k % len(colors)]
            ax.barh(1, c1 - c0, left=c0, height=0.6, color=color, edgecolor="black", lw=0.5)
            ax.barh(0, a1 - a0, left=a0, height=0.6, color=color, edgecolor="black", lw=0.5)
            if len(buckets) <= 4 and c1 - c0 > 0.12:   # a label only where it fits
                ax.text((c0 + c1) / 2, 1, f"bucket {k}\n{buckets[k].nbytes / 2**20:.1f} MiB", ha="center",
                        va="center", fontsize=7)
        exposed = comm[-1][1] - compute[-1][1]
        ax.axvline(compute[-1][1], color="black", ls=":", lw=1)
        ax.annotate("", xy=(comm[-1][1], -0.55), xytext=(compute[-1][1], -0.55),
                    arrowprops={"arrowstyle": "<->", "color": "#d62728"})
        ax.text((compute[-1][1] + comm[-1][1]) / 2, -0.95, f"exposed: {exposed:.2f}", ha="center", fontsize=8,
                color="#d62728")
        ax.set_yticks([0, 1], ["all-reduce", "backward"], fontsize=8)
        ax.set_ylim(-1.2, 1.5)
        total = sum(b.nbytes for b in buckets)
        ax.set_title(f"{preset}: {total / 2**20:.1f} MiB of fp32 gradients, bucket_cap_mb={cap:g} → "
                     f"{len(buckets)} bucket{'s' if len(buckets) > 1 else ''}", fontsize=9, loc="left")
        ax.grid(axis="x", alpha=0.3)
    axes[-1].set_xlabel("time, in units of one backward pass (optimizer.step() waits for the last all-reduce)")
    fig.suptitle("DDP overlaps each bucket's all-reduce with the rest of backward\n"
                 "buckets: DDP's own assignment for the model; times: α-β model, all-reduce of the whole gradient = "
                 f"{COMM_PER_BACKWARD:g} × backward, α = {CALL_LATENCY:g} per call", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


# ------------------------------------------------------------------ files
DIAGRAMS = {"ring_allreduce.png": draw_ring_allreduce, "ddp_bucket_overlap.png": draw_bucket_overlap}


def draw_all(out_dir: Path = FIGURES, dpi: int = 110) -> list[Path]:
    """Draw every diagram of chapters 01-02 into ``out_dir``; returns the files written."""
    return save_figures(out_dir, DIAGRAMS, dpi=dpi)


def main(argv: list[str] | None = None) -> None:
    redraw_main("Redraw chapters 01-02's diagrams (ring all-reduce, DDP buckets).", draw_all, argv)


if __name__ == "__main__":
    main()
