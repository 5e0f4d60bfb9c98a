"""ZeRO-3's loading path: each rank materialises only its partition of a local checkpoint.

``from_pretrained`` then ``deepspeed.initialize`` builds the whole model on every rank first. Here the model is built
under ``zero.Init`` (partitioned as each module returns, no random init) and filled module by module from rank 0's
reader, so a rank's peak is its partition plus one gathered module.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ecomkit.errors import EcomkitError
from ecomkit.models.bloom import ModelSource, build_empty_model
from ecomkit.models.checkpoint_files import CheckpointReader, freed_memory_returned
from ecomkit.parallel.zero.env import ensure_deepspeed_env


def build_partitioned(source: ModelSource, ds_config: dict[str, Any]) -> nn.Module:
    """Construct ``source``'s architecture under ``zero.Init`` (partitioned, uninitialised), then load it."""
    ensure_deepspeed_env()
    import deepspeed  # lazy: heavy optional dependency

    reader = CheckpointReader(source.name_or_path)
    with freed_memory_returned():
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            model = build_empty_model(source, device="cpu")
        load_partitioned(model, reader)
    return model


def load_partitioned(model: nn.Module, reader: CheckpointReader) -> None:
    """Copy the checkpoint into a ``zero.Init`` model module by module (a collective: call it on every rank)."""
    ensure_deepspeed_env()
    import deepspeed  # lazy: heavy optional dependency

    prefix = getattr(model, "base_model_prefix", "")
    is_writer = dist.get_rank() == 0
    seen: set[int] = set()
    missing: list[str] = []
    for module_name, module in model.named_modules():
        own = [(f"{module_name}.{n}" if module_name else n, p)
               for n, p in module.named_parameters(recurse=False) if id(p) not in seen]
        seen.update(id(p) for _, p in own)
        keys = [reader.resolve(name, prefix) for name, _ in own]
        missing += [name for (name, _), key in zip(own, keys) if key is None]
        if own:
            with deepspeed.zero.GatheredParameters([p for _, p in own], modifier_rank=0), torch.no_grad():
                if is_writer:
                    for (_, p), key in zip(own, keys):
                        if key is not None:
                            p.data.copy_(reader.read(key, dtype=p.dtype))
        for name, buf in module.named_buffers(recurse=False):  # not partitioned: every rank reads its copy
            key = reader.resolve(f"{module_name}.{name}" if module_name else name, prefix)
            if key is not None:
                with torch.no_grad():
                    buf.copy_(reader.read(key, dtype=buf.dtype))
    if missing:
        raise EcomkitError(f"The checkpoint has no tensor for {missing[:5]}{' ...' if len(missing) > 5 else ''} "
                           f"({len(missing)} in all); it was saved from a different architecture. Check --model.")


def partitioned_parameter_count(model: nn.Module) -> int:
    """Ψ of a model whose parameters may be ZeRO-3 partitions (``numel()`` is then 0; DeepSpeed keeps ``ds_numel``)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += int(getattr(p, "ds_numel", p.numel()))
    return total


def partition_bytes(model: nn.Module) -> int:
    """Bytes of parameter partitions this rank holds (``ds_tensor``), or of whole parameters when not partitioned."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        t = getattr(p, "ds_tensor", p)
        total += t.numel() * t.element_size()
    return total
