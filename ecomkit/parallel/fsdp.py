"""FSDP2 (``fully_shard``) for BLOOM: one FSDP unit per transformer block, then the root.

What FSDP2 does (the ZeRO-3 idea on DTensors): every parameter is stored as a
``DTensor`` sharded on dim 0 across the data-parallel ranks, so each rank keeps
``1/dp`` of the parameters, gradients and AdamW states. Before a unit's
forward its parameters are all-gathered, after its backward the gradients are
reduce-scattered (averaged), and the optimizer steps on the local shards.

Why one unit per block, then the root: a unit is the granularity of
communication and of memory. Per block, only one block's full parameters exist
at a time (plus the prefetched next one), and the all-gather of block ``i+1``
overlaps the compute of block ``i``. The root unit collects what is left:
embeddings (tied to the LM head, so both stay in one unit), the embedding
LayerNorm and ``ln_f``.

``reshard_after_forward``:
- ``True`` (ZeRO-3-like): free each block's gathered parameters after its
  forward and all-gather them again in backward: least memory, 1.5× the
  communication of DDP (all-gather fwd + all-gather bwd + reduce-scatter).
- ``False`` (ZeRO-2-like): keep them gathered until backward: no second
  all-gather, but full parameters live through the whole forward/backward.
  The root is never resharded after forward (its parameters are needed first
  thing in backward anyway); FSDP2 does that by default.

Mixed precision (``MixedPrecisionPolicy``): with ``--precision bf16`` the
gathered parameters and the compute are bf16 (half the all-gather bytes),
while the sharded master parameters, the optimizer and the gradient
reduce-scatter stay fp32 (``reduce_dtype``), which keeps summed gradients
accurate.

CPU offload (``CPUOffloadPolicy``): sharded parameters, gradients and
optimizer states live in host memory and the optimizer steps on the CPU; each
unit is copied to the GPU before its all-gather. On a CPU-only machine it
changes nothing (everything is already in host memory), so it is accepted
and reported, not measured, there.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from ecomkit.errors import EcomkitError
from ecomkit.models.checkpoint_files import CheckpointReader, freed_memory_returned
from ecomkit.models.lora import ADAPTER_INIT_ATTR, checkpoint_key
from ecomkit.parallel.tensor import bloom_blocks

_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."  # activation checkpointing's wrapper; keys do not have it

PARAM_DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def mixed_precision_policy(precision: str) -> Any:
    """``MixedPrecisionPolicy`` for ``precision``: bf16 compute with fp32 gradient reduction, or none."""
    return MixedPrecisionPolicy(param_dtype=PARAM_DTYPES.get(precision), reduce_dtype=torch.float32)


def offload_policy(cpu_offload: bool, device: torch.device) -> Any:
    """``CPUOffloadPolicy`` when asked (pinned memory only where a GPU exists), else no offload."""
    if not cpu_offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=device.type == "cuda")


def apply_fsdp(model: nn.Module, dp_mesh: Any, *, precision: str = "fp32", reshard_after_forward: bool = True,
               cpu_offload: bool = False, device: torch.device | None = None, root: nn.Module | None = None
               ) -> nn.Module:
    """``fully_shard`` each BLOOM block, then the root unit (``root``, default the whole model); returns ``model``.

    ``dp_mesh`` may be a 1-D mesh or the ``dp`` sub-mesh of a (pp, dp, tp)
    mesh: parameters already split by tensor parallelism then become 2-D
    DTensors (sharded over dp *and* tp). ``root``: a module that contains
    ``model`` (a pipeline stage wrapping its pruned model), so that the stage
    the pipeline schedule runs is the FSDP module it drives.
    """
    common = {"mesh": dp_mesh, "mp_policy": mixed_precision_policy(precision),
              "offload_policy": offload_policy(cpu_offload, device or torch.device("cpu"))}
    for block in bloom_blocks(model):
        fully_shard(block, reshard_after_forward=reshard_after_forward, **common)
    fully_shard(model if root is None else root, reshard_after_forward=False, **common)
    return model


def load_local_parts(model: nn.Module, reader: CheckpointReader, device: torch.device) -> nn.Module:
    """Materialise a model sharded on the meta device (FSDP2 and/or TP) from a checkpoint, one tensor at a time.

    Order: the model was built on ``meta`` and parallelized there (every
    parameter is a DTensor with its final mesh and placements, nothing
    allocated); ``to_empty`` now allocates only this rank's local shards, and
    each checkpoint tensor is read whole (:class:`CheckpointReader`, no file
    mapping), cut with ``distribute_tensor(..., src_data_rank=None)`` (every
    rank slices its own part locally, no communication) and copied into the
    local shard, then freed. So a rank's peak is its shards plus the largest
    tensor, whatever the model's size; every rank reads the files itself.
    """
    prefix = getattr(model, "base_model_prefix", "")
    tied = _tied_parameter_names(model)
    adapter_init = getattr(model, ADAPTER_INIT_ATTR, {})  # LoRA's seeded initial values (ecomkit.models.lora)
    model.to_empty(device=device)
    _retie(model, tied)  # to_empty gives each module its own new tensor: a plain (TP-replicated) tie would split
    missing = []
    with torch.no_grad(), freed_memory_returned():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            name = name.replace(_CHECKPOINT_PREFIX, "")
            key = reader.resolve(checkpoint_key(name), prefix)
            if key is None and name not in adapter_init:
                missing.append(name)
                continue
            full = (reader.read(key, dtype=tensor.dtype) if key is not None
                    else adapter_init[name].to(tensor.dtype)).to(device)
            if isinstance(tensor, DTensor):
                local = distribute_tensor(full, tensor.device_mesh, tensor.placements, src_data_rank=None).to_local()
                tensor.to_local().copy_(local)
            else:
                tensor.copy_(full)
            del full
    if missing:
        raise EcomkitError(f"The checkpoint has no tensor for {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                           f"({len(missing)} in all); it was saved from a different architecture. Check --model.")
    return model


def _tied_parameter_names(model: nn.Module) -> list[list[str]]:
    """Groups of parameter names that share one tensor (BLOOM: the embedding and the LM head)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _retie(model: nn.Module, groups: list[list[str]]) -> None:
    for first, *others in groups:
        shared = model.get_parameter(first)
        for name in others:
            owner, _, attr = name.rpartition(".")
            module = model.get_submodule(owner)
            if getattr(module, attr) is not shared:
                setattr(module, attr, shared)


def set_gradient_sync(model: nn.Module, enabled: bool) -> None:
    """FSDP2's ``no_sync``: skip the reduce-scatter on gradient-accumulation micro-steps.

    Gradients then accumulate unsharded (more memory, less communication);
    the last micro-step of an optimizer step reduces everything at once.
    """
    setter = getattr(model, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(enabled)
