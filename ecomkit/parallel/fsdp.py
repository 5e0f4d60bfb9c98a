"""FSDP2 (``fully_shard``) for BLOOM: one FSDP unit per transformer block, then the root.

Why per block: only one block's full parameters exist at a time and block ``i+1``'s all-gather overlaps block
``i``'s compute; the root holds the tied embedding/LM head and the LayerNorms. Under bf16 the gathered parameters
and compute are bf16 while the shards, optimizer and gradient reduce-scatter stay fp32.
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

    ``dp_mesh``: 1-D, or the ``dp`` sub-mesh of (pp, dp, tp). ``root``: a module containing ``model`` (a pipeline
    stage).
    """
    common = {"mesh": dp_mesh, "mp_policy": mixed_precision_policy(precision),
              "offload_policy": offload_policy(cpu_offload, device or torch.device("cpu"))}
    for block in bloom_blocks(model):
        fully_shard(block, reshard_after_forward=reshard_after_forward, **common)
    fully_shard(model if root is None else root, reshard_after_forward=False, **common)
    return model


def load_local_parts(model: nn.Module, reader: CheckpointReader, device: torch.device) -> nn.Module:
    """Materialise a model sharded on the meta device (FSDP2 and/or TP) from a checkpoint, one tensor at a time.

    Why: each rank slices every whole tensor into its local shard without communication, so its peak is its shards
    plus the largest tensor, whatever the model's size.
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
    """FSDP2's ``no_sync``: skip the reduce-scatter on accumulation micro-steps (the last one reduces all)."""
    setter = getattr(model, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(enabled)
