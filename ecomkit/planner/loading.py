"""The planner's "while loading" row: device bytes per rank while the model is loaded, by the path ecomkit takes.

A model is loaded in the dtype its strategy trains the weights in (``Strategy.weight_dtype``), so loading
never holds more bytes per weight than training does:

- torch's strategies (DDP, FSDP2, TP, PP) keep fp32 weights (autocast and FSDP2's mixed-precision policy
  compute in bf16 from them): 4 bytes per weight;
- DeepSpeed (ZeRO-1/2/3) holds its module in the training dtype: 2 bytes in bf16/fp16;
- LoRA's frozen base under ``--precision bf16`` is bf16 (:mod:`ecomkit.planner.lora` passes 2).

A local checkpoint is read one tensor at a time (``models/checkpoint_files.py``): each tensor as stored,
converted in host memory, copied into place. A GPU thus holds only the model (and the CUDA context); a CPU
plan, where host memory is the device, adds the tensor being read (the largest, assumed stored in fp32) and
its converted copy. ``benchmarks/bench_load.py`` measures these peaks on CPU and sets them beside this row.
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

# CUDA context + cuBLAS/cuDNN workspaces + NCCL buffers: ~0.5-1 GiB per process on A100/H100 with
# recent CUDA (what nvidia-smi shows for an idle process that initialised CUDA). Not measured here.
CUDA_CONTEXT_BYTES = int(0.75 * GIB)
STORED_BYTES = 4      # a checkpoint's tensors as stored: fp32 assumed (the larger case; a bf16 file reads half)


def training_weight_bytes(inp: PlanInput) -> int:
    """Bytes per weight a full fine-tune holds, which it loads in: DeepSpeed the training dtype, torch fp32."""
    return 2 if inp.strategy in DEEPSPEED_PLAN_STRATEGIES and inp.precision != "fp32" else 4


def load_peak(inp: PlanInput, shape: ModelShape, params: list[ParamInfo],
              weight_bytes: int | None = None) -> tuple[int, str]:
    """Device bytes per rank while the model is loaded, and the load path's name.

    ``weight_bytes``: bytes per weight the run holds (default :func:`training_weight_bytes`; LoRA passes its
    frozen base's). By strategy:

    - ZeRO-3 (``deepspeed.zero.Init``, then module by module): this rank's partition in the training
      dtype (0 with parameter offload) plus the largest module's gathered parameters (BLOOM: the embedding);
    - FSDP2 / TP without a pipeline (meta device, then each rank's part, one tensor at a time): the
      rank's shard (0 with CPU offload) plus the largest tensor read whole (fp32) and its local piece;
    - DDP, ZeRO-1/2 and pipelines: the whole model on every rank in ``weight_bytes`` per weight, then the
      strategy (ZeRO-1/2 keep whole parameters anyway; a pipeline cuts a built model); a CPU plan adds the
      tensor being read and its converted copy.
    Plus the CUDA context, as in training.
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
