"""The planner's "while loading" row: device bytes per rank while the model is loaded, by the path ecomkit takes.

A model loads in the dtype its strategy trains the weights in, so loading never holds more per weight than training.
"""

from __future__ import annotations

from typing import Protocol

from ecomkit.config import DEEPSPEED_PLAN_STRATEGIES
from ecomkit.hardware import GIB
from ecomkit.planner.shapes import ModelShape, ParamInfo, fsdp2_shard, zero3_partition


class PlanInput(Protocol):
    """The fields of ``planner.memory.PlanInput`` this row reads (a protocol: memory imports this module)."""

    strategy: str
    precision: str
    device: str
    offload_param: bool
    world_size: int
    pp: int

    @property
    def dp(self) -> int: ...

# CUDA context + cuBLAS workspaces + NCCL buffers per process: an assumption, not measured here.
CUDA_CONTEXT_BYTES = int(0.75 * GIB)
STORED_BYTES = 4      # a checkpoint's tensors as stored: fp32 assumed (the larger case; a bf16 file reads half)


def training_weight_bytes(inp: PlanInput) -> int:
    """Bytes per weight a full fine-tune holds, which it loads in: DeepSpeed the training dtype, torch fp32."""
    return 2 if inp.strategy in DEEPSPEED_PLAN_STRATEGIES and inp.precision != "fp32" else 4


def load_peak(inp: PlanInput, shape: ModelShape, params: list[ParamInfo],
              weight_bytes: int | None = None) -> tuple[int, str]:
    """Device bytes per rank while the model is loaded, and the load path's name.

    ZeRO-3: partition + the largest gathered module; FSDP2/TP: shard + the largest tensor read whole and its piece;
    otherwise the whole model in ``weight_bytes`` per weight (a CPU plan adds the tensor being read). Plus CUDA context.
    """
    context = CUDA_CONTEXT_BYTES if inp.device == "cuda" else 0
    w = weight_bytes or training_weight_bytes(inp)
    if inp.strategy == "zero3":
        part = 0 if inp.offload_param else w * zero3_partition(params, inp.dp)
        return context + part + w * shape.largest_leaf, "deepspeed.zero.Init: partition + one gathered module"
    if inp.strategy in ("fsdp2", "tp") and inp.pp == 1 and inp.world_size > 1:
        local = 0 if inp.offload_param else w * fsdp2_shard(params, inp.dp, 0)
        largest = STORED_BYTES * shape.largest_leaf
        return (context + local + largest + largest // inp.world_size,
                "meta device, then each rank's shard, one tensor at a time")
    reading = 0
    if inp.device == "cpu":   # on a GPU the tensor being read and converted is in host memory, not the device's
        reading = (STORED_BYTES + (w if w != STORED_BYTES else 0)) * shape.largest_leaf
    dtype = {2: "16-bit", 4: "fp32"}.get(w, f"{w}-byte")
    return context + w * shape.n_params + reading, f"the whole {dtype} model on every rank, then the strategy"
