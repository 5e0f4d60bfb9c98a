"""Bytes of tensors a rank holds, each storage counted once: the one storage-dedup counter of ecomkit.

Why count tensors: a CPU has no ``max_memory_allocated`` and RSS mixes in the runtime. :func:`unique_storage_bytes`
counts whole storages (what the allocator handed out: ZeRO's flat partitions, activations); :func:`tensor_bytes` counts
what the views cover (FSDP2's unpadded shards, as the planner does). DTensors count their local shard.
"""

from __future__ import annotations

from typing import Iterable

import torch


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` stored on this rank (``DTensor.numel()`` is the *global* size)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of the storage behind ``t``'s local part; None when there is none to count.

    None for meta tensors, empty storages and wrappers without a storage (functional tensors inside ``torch.compile``).
    """
    t = local_tensor(t)
    if t.device.type == "meta":
        return None
    try:
        st = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a wrapper subclass with no storage of its own
        return None
    return (st.data_ptr(), st.nbytes()) if st.nbytes() else None


def unique_storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Sum of whole storages, each counted once (views, tied weights and padding included)."""
    sizes: dict[int, int] = {}
    for t in tensors:
        key = None if t is None else storage_key(t)
        if key is not None:
            sizes.setdefault(key[0], key[1])
    return sum(sizes.values())


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Sum of local bytes the tensors cover, each (storage, offset) view once; meta tensors count their would-be size.
    """
    seen: set[tuple[int, int]] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = local_tensor(t)
        key = storage_key(t)
        if key is not None:
            if (key[0], t.storage_offset()) in seen:
                continue
            seen.add((key[0], t.storage_offset()))
        total += t.numel() * t.element_size()
    return total


def optimizer_state_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The per-parameter state tensors of a torch optimizer (Adam's moments); scalars such as ``step`` left out."""
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
