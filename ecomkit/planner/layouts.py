"""Which parallel layout for which model (chapter 04): memory per GPU, bytes sent per step, and the pick.

Why in the planner: a layout is judged before any GPU is rented, with :func:`~ecomkit.planner.memory.plan_memory`'s
exact per-rank bytes; this module adds the bytes each layout sends per step and the rule that picks one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ecomkit.config import StrategyName, plan_strategy_name
from ecomkit.planner.memory import plan_memory
from ecomkit.planner.shapes import ModelShape, local_params, model_shape


@dataclass(frozen=True)
class Layout:
    """A candidate way to use ``gpus`` GPUs: the degrees, and whether dp replicas shard (FSDP2) or replicate (DDP)."""

    name: str
    dp: int
    tp: int = 1
    pp: int = 1
    sharded: bool = True

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def planner_strategy(self) -> str:
        """The planner's strategy name for this layout (TP/PP shard their dp replicas with FSDP2)."""
        if not self.sharded:
            return plan_strategy_name(StrategyName.DDP)
        if self.tp > 1:
            return plan_strategy_name(StrategyName.TP)
        return plan_strategy_name(StrategyName.PP if self.pp > 1 else StrategyName.FSDP)


def replica_parameters(shape: ModelShape, layout: Layout) -> int:
    """Parameters one rank of the most loaded pipeline stage holds before FSDP sharding (its tp slice)."""
    return max(sum(p.numel for p in local_params(shape, layout.tp, layout.pp, stage)) for stage in range(layout.pp))


def comm_bytes_per_gpu_step(shape: ModelShape, layout: Layout, micro_batch: int, seq_len: int) -> dict[str, float]:
    """Estimated bytes one GPU sends per optimizer step (ring algorithms; bf16 activations/params, fp32 grads).

    A replica processes ``micro_batch × tp × pp`` sequences, so every layout does the same work per step.

    - DDP: all-reduce of fp32 gradients, ``2(d-1)/d · 4Ψ``;
    - FSDP2: bf16 all-gather in forward and backward, fp32 reduce-scatter: ``(d-1)/d · (2·2 + 4)·Ψ_local``;
    - TP: 4 all-reduces of the ``b·s·h`` bf16 activations per block, ``2(t-1)/t`` each;
    - PP: ``2 · b·s·h`` bf16 per stage boundary, plus the tied-embedding gradient all-reduce.
    """
    h, s = shape.hidden, seq_len
    b = micro_batch * layout.tp * layout.pp
    local = replica_parameters(shape, layout)
    d, t, p = layout.dp, layout.tp, layout.pp
    out = {"data_parallel": 0.0, "tensor_parallel": 0.0, "pipeline": 0.0}
    if d > 1:
        ring = (d - 1) / d
        out["data_parallel"] = ring * (2 * 2 + 4) * local if layout.sharded else 2 * ring * 4 * local
    if t > 1:
        blocks = -(-shape.n_layer // p)
        out["tensor_parallel"] = blocks * 4 * 2 * (t - 1) / t * 2 * b * s * h
    if p > 1:
        out["pipeline"] = 2 * 2 * b * s * h + 4 * shape.vocab * h
    out["total"] = sum(out.values())
    return out


# Simplest first: overlapped communication (DP, FSDP) beats TP's per-layer collectives and PP's bubbles; 3-D last.
PREFERENCE = ("DP (DDP)", "ZeRO-3 / FSDP2", "TP 2 × FSDP", "TP 2 × PP 2 × FSDP", "TP", "PP")


def candidate_layouts(n_gpus: int, n_head: int, n_layer: int) -> list[Layout]:
    """DDP, FSDP2, TP 2 × FSDP, TP 2 × PP 2 × FSDP (8 GPUs and more), TP and PP over all (as the shape allows)."""
    out = [Layout("DP (DDP)", dp=n_gpus, sharded=False), Layout("ZeRO-3 / FSDP2", dp=n_gpus)]
    if n_gpus >= 4 and n_head % 2 == 0:
        out.append(Layout(f"TP 2 × FSDP {n_gpus // 2}", dp=n_gpus // 2, tp=2))
    if n_gpus >= 8 and n_gpus % 4 == 0 and n_head % 2 == 0 and n_layer >= 2:
        out.append(Layout(f"TP 2 × PP 2 × FSDP {n_gpus // 4}", dp=n_gpus // 4, tp=2, pp=2))
    if n_head % n_gpus == 0:
        out.append(Layout(f"TP {n_gpus}", dp=1, tp=n_gpus))
    if n_gpus <= n_layer:
        out.append(Layout(f"PP {n_gpus} (1F1B)", dp=1, pp=n_gpus))
    return out


def _preference(layout_name: str) -> int:
    return next(i for i, prefix in enumerate(PREFERENCE) if layout_name.startswith(prefix))


def decision_table(models: Sequence[str], gpu_counts: Sequence[int], gpu: str = "a100-80g", micro_batch: int = 4,
                   seq_len: int = 1024, precision: str = "bf16", activation_checkpointing: bool = False
                   ) -> list[dict[str, Any]]:
    """One row per (model, GPUs, layout): memory per GPU and bytes sent per step, and which layout to pick.

    Same global batch for every layout; memory is ``plan_memory``'s most loaded rank, and the pick per (model, GPUs) is
    the first fitting layout in :data:`PREFERENCE` order. Ψ and every shape come from the presets built on ``meta``.
    """
    rows = []
    for name in models:
        shape = model_shape(name)
        for n in gpu_counts:
            group = []
            for layout in candidate_layouts(n, shape.n_head, shape.n_layer):
                plan = plan_memory(model=name, world_size=n, strategy=layout.planner_strategy, tp=layout.tp,
                                   pp=layout.pp, precision=precision, micro_batch=micro_batch * layout.tp * layout.pp,
                                   seq_len=seq_len, gpu=gpu, activation_checkpointing=activation_checkpointing)
                comm = comm_bytes_per_gpu_step(shape, layout, micro_batch, seq_len)
                label = layout.name + (" +AC" if activation_checkpointing else "")
                group.append({"model": name, "gpus": n, "layout": label,
                              "dp": layout.dp, "tp": layout.tp,
                              "pp": layout.pp, "state_gb": plan.model_states / 1e9,
                              "activation_gb": (plan.activation_total + plan.temporary_total) / 1e9,
                              "total_gb": plan.total / 1e9, "fits": plan.fits,
                              "comm_gb_per_step": comm["total"] / 1e9})
            fitting = sorted((r for r in group if r["fits"]), key=lambda r: _preference(r["layout"]))
            for r in group:
                r["pick"] = bool(fitting) and r is fitting[0]
            rows.extend(group)
    return rows


__all__ = ["Layout", "replica_parameters", "comm_bytes_per_gpu_step", "PREFERENCE", "candidate_layouts",
           "decision_table"]
