"""Bytes of tensors a rank holds, each storage counted once: the one storage-dedup counter of ecomkit.

Why count tensors: on CPU there is no ``max_memory_allocated``, and process RSS
mixes in the Python runtime and libraries. Counting the parameter, gradient
and optimizer-state tensors a rank actually holds gives the exact bytes the
ZeRO/FSDP formulas talk about, on any device.

Every counter here identifies memory by :func:`storage_key` (the storage's
data pointer), so tied weights, views and flat buffers are never counted
twice. Two questions need two sums over those keys:

- :func:`unique_storage_bytes`: the *whole* storage behind each tensor, once.
  What an allocator really handed out, alignment padding included: the ZeRO
  count (flat partitions) and the saved-activation count use it.
- :func:`tensor_bytes`: the bytes the tensors *cover*, each distinct view once.
  FSDP2's shards are views into padded buffers and the planner counts the
  unpadded shard, so the model-state count of torch strategies uses this.

Sharded tensors (FSDP2's DTensor) are counted by their local shard.
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

    None for meta tensors, empty storages and wrappers without a storage of
    their own (functional tensors inside ``torch.compile``).
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
    """Sum of local bytes the tensors cover, each (storage, offset) view counted once (tied weights).

    Meta tensors count their would-be size (a planner's model built on ``meta``).
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
