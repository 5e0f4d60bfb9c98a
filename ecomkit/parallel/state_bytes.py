"""Exact model-state bytes per rank, by counting the tensors this rank holds.

Why count tensors: on CPU there is no ``max_memory_allocated``, and process RSS
mixes in the Python runtime and libraries. Counting the parameter, gradient
and optimizer-state tensors a rank actually holds gives the exact bytes the
ZeRO/FSDP formulas talk about, on any device. Sharded tensors (FSDP2's
DTensor) are counted by their local shard.
"""

from __future__ import annotations

from typing import Iterable

import torch


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` stored on this rank (``DTensor.numel()`` is the *global* size)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Sum of local bytes, each storage counted once (tied weights, views)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = local_tensor(t)
        if t.device.type == "meta":
            total += t.numel() * t.element_size()
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def optimizer_state_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    out = []
    for state in optimizer.state.values():
        out.extend(v for v in state.values() if torch.is_tensor(v) and v.dim() > 0)
    return out


def model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """{"params", "grads", "optimizer", "total"} bytes held by this rank."""
    params = list(model.parameters())
    out = {
        "params": tensor_bytes(params),
        "grads": tensor_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": tensor_bytes(optimizer_state_tensors(optimizer)),
    }
    out["total"] = sum(out.values())
    return out
