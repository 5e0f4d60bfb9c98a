"""Model states per device by ZeRO stage, for any Ψ: the ZeRO paper's table, from the planner's own partitions.

Built from the planner's exact per-rank partitions, not the formulas, so reproducing the paper's Figure 1 checks
them. Ψ comes from a model's shapes or, with ``--n-params``, from a number cut into equal tensors.
"""

from __future__ import annotations

from typing import Any

from ecomkit.planner.memory import PlanInput, state_bytes_of_rank
from ecomkit.planner.shapes import ModelShape, local_params
from ecomkit.planner.zero_formulas import formula_label

GB = 1e9   # the paper reports decimal gigabytes
# stage → planner strategy; stage 0 is DDP (torch keeps 4 + 4 + 8 bytes, the paper 2 + 2 + 12: both 16Ψ)
STAGE_STRATEGIES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
# ranks sampled per stage: ZeRO-1/2 ranks differ only where a tensor straddles a partition boundary
MAX_RANKS = 64


def zero_stage_table(shape: ModelShape, n: int, precision: str = "bf16") -> list[dict[str, Any]]:
    """Per-device model-state bytes (the worst rank) for stages 0-3 of ``shape`` on ``n`` data-parallel ranks."""
    params = local_params(shape)
    rows = []
    for stage, strategy in STAGE_STRATEGIES.items():
        inp = PlanInput(model=shape.name, world_size=n, strategy=strategy, precision=precision, device="cpu")
        ranks = [state_bytes_of_rank(inp, params, r) for r in range(min(n, MAX_RANKS))]
        worst = max(ranks, key=lambda d: d["params"] + d["grads"] + d["optimizer"])
        total = worst["params"] + worst["grads"] + worst["optimizer"]
        rows.append({"stage": stage, "strategy": strategy, "params": worst["params"], "grads": worst["grads"],
                     "optimizer": worst["optimizer"], "total": total, "total_gb": total / GB})
    return rows


def render_zero_stage_table(shape: ModelShape, n: int, rows: list[dict[str, Any]], precision: str = "bf16") -> str:
    kind = "mixed-precision Adam, the ZeRO paper's setting" if precision != "fp32" else \
        "fp32: DeepSpeed keeps 4-byte weights and grads and still an fp32 master copy"
    p = 4 if precision == "fp32" else 2
    lines = [f"model states per device, Ψ = {shape.n_params:,} ({shape.name}), N = {n}, {precision} ({kind})",
             f"{'stage':<8}{'formula':<14}{'params GB':>11}{'grads GB':>10}{'optimizer GB':>14}{'total GB':>10}"]
    for r in rows:
        lines.append(f"{r['stage']:<8}{formula_label(r['stage'], p):<14}{r['params'] / GB:>11.2f}"
                     f"{r['grads'] / GB:>10.2f}{r['optimizer'] / GB:>14.2f}{r['total_gb']:>10.1f}")
    lines.append("stage 0 is ecomkit's DDP (fp32 weights, grads and Adam moments: 16Ψ in every precision)")
    return "\n".join(lines)


__all__ = ["zero_stage_table", "render_zero_stage_table", "STAGE_STRATEGIES", "GB"]
