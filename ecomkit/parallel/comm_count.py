"""Count the collectives a training step issues, and their bytes, whatever issued them.

A ``TorchDispatchMode`` sees every c10d and functional collective as an operator (DDP, FSDP2, DTensor, pipeline
send/recv), so nothing is patched. ``payload_bytes`` is the logical tensor (exact); ``wire_bytes`` is what this
rank sends under ring/pairwise algorithms (an estimate). Every op passes through Python while counting.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import torch
from torch.distributed import ProcessGroup
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# operator name (namespace::name) → (kind, index of the argument that holds the payload, multiplier source)
# multiplier "group" means: payload = argument bytes × group size (functional all-gather's input).
_RULES: dict[str, tuple[str, int, str | None]] = {
    "c10d::allreduce_": ("all_reduce", 0, None),
    "c10d::allreduce_coalesced_": ("all_reduce", 0, None),
    "c10d::_allgather_base_": ("all_gather", 0, None),
    "c10d::allgather_": ("all_gather", 0, None),
    "c10d::allgather_coalesced_": ("all_gather", 0, None),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", 0, None),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 1, None),
    "c10d::reduce_scatter_": ("reduce_scatter", 1, None),
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1, None),
    "c10d::broadcast_": ("broadcast", 0, None),
    "c10d::reduce_": ("reduce", 0, None),
    "c10d::gather_": ("gather", 1, None),
    "c10d::scatter_": ("scatter", 0, None),
    "c10d::alltoall_": ("all_to_all", 1, None),
    "c10d::alltoall_base_": ("all_to_all", 1, None),
    "c10d::send": ("send", 0, None),
    "c10d::recv_": ("recv", 0, None),
    "c10d::recv_any_source_": ("recv", 0, None),
    "c10d::barrier": ("barrier", -1, None),
    "_c10d_functional::all_reduce": ("all_reduce", 0, None),
    "_c10d_functional::all_reduce_": ("all_reduce", 0, None),
    "_c10d_functional::all_reduce_coalesced": ("all_reduce", 0, None),
    "_c10d_functional::all_reduce_coalesced_": ("all_reduce", 0, None),
    "_c10d_functional::all_gather_into_tensor": ("all_gather", 0, "group"),
    "_c10d_functional::all_gather_into_tensor_out": ("all_gather", 0, "group"),
    "_c10d_functional::all_gather_into_tensor_coalesced": ("all_gather", 0, "group"),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", 0, None),
    "_c10d_functional::reduce_scatter_tensor_out": ("reduce_scatter", 0, None),
    "_c10d_functional::reduce_scatter_tensor_coalesced": ("reduce_scatter", 0, None),
    "_c10d_functional::broadcast": ("broadcast", 0, None),
    "_c10d_functional::broadcast_": ("broadcast", 0, None),
    "_c10d_functional::all_to_all_single": ("all_to_all", 0, None),
    "_c10d_functional::isend": ("send", 0, None),
    "_c10d_functional::irecv": ("recv", 0, None),
    "_c10d_functional_autograd::all_gather_into_tensor": ("all_gather", 0, "group"),
    "_c10d_functional_autograd::reduce_scatter_tensor": ("reduce_scatter", 0, None),
    "_c10d_functional_autograd::all_to_all_single": ("all_to_all", 0, None),
}

# share of the payload this rank sends, for a group of n ranks (ring / pairwise algorithms)
_WIRE_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "gather": lambda n: 1.0 / n,
    "scatter": lambda n: 1.0,
    "send": lambda n: 1.0,
    "recv": lambda n: 0.0,
    "barrier": lambda n: 0.0,
}


def _tensors(obj: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(obj)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _bytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def _group_size(args: tuple, kwargs: dict) -> int | None:
    """Size of the process group an operator runs on (c10d passes the group object, funcol its name)."""
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, ProcessGroup):
            return value.size()
        if isinstance(value, torch.ScriptObject):  # c10d operators receive the group boxed as a ScriptObject
            try:
                return ProcessGroup.unbox(value).size()
            except Exception:  # another kind of ScriptObject (e.g. the reduce op)
                continue
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, str):
            try:
                return _resolve_process_group(value).size()
            except Exception:  # not a group name
                continue
    for value in args:  # functional all-gather / reduce-scatter pass group_size as an int
        if isinstance(value, int) and value > 0 and not isinstance(value, bool):
            return value
    return None


@dataclass
class KindStats:
    count: int = 0
    payload_bytes: int = 0
    wire_bytes: float = 0.0


@dataclass
class CollectiveStats:
    """Collectives seen, per kind (all_reduce, all_gather, reduce_scatter, send, recv, ...)."""

    by_kind: dict[str, KindStats] = field(default_factory=lambda: defaultdict(KindStats))

    def add(self, kind: str, payload: int, group: int | None) -> None:
        stats = self.by_kind[kind]
        stats.count += 1
        stats.payload_bytes += payload
        n = group or 1
        stats.wire_bytes += payload * (_WIRE_FACTOR.get(kind, lambda n: 1.0)(n) if n > 1 else 0.0)

    @property
    def count(self) -> int:
        return sum(s.count for k, s in self.by_kind.items() if k != "barrier")

    @property
    def payload_bytes(self) -> int:
        return sum(s.payload_bytes for s in self.by_kind.values())

    @property
    def wire_bytes(self) -> float:
        return sum(s.wire_bytes for s in self.by_kind.values())

    def as_dict(self, prefix: str = "comm_") -> dict[str, Any]:
        """Flat metrics-row fields: ``comm_count``, ``comm_payload_bytes``, ``comm_wire_bytes``, ``comm_by_kind``."""
        return {
            f"{prefix}count": self.count,
            f"{prefix}payload_bytes": self.payload_bytes,
            f"{prefix}wire_bytes": round(self.wire_bytes),
            f"{prefix}by_kind": {k: {"count": s.count, "payload_bytes": s.payload_bytes,
                                     "wire_bytes": round(s.wire_bytes)}
                                 for k, s in sorted(self.by_kind.items()) if s.count},
        }


class CollectiveCounter(TorchDispatchMode):
    """``with CollectiveCounter() as c: ...`` then ``c.stats``; re-enter to keep adding, ``pop_stats()`` to reset."""

    def __init__(self) -> None:
        super().__init__()
        self.stats = CollectiveStats()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(_is_dtensor_type(t) for t in types):
            return NotImplemented  # let DTensor lower it; its collectives come back through this mode
        out = func(*args, **kwargs)
        rule = _RULES.get(func._schema.name) if hasattr(func, "_schema") else None
        if rule is not None:
            kind, index, multiplier = rule
            payload = _bytes(args[index]) if 0 <= index < len(args) else 0
            group = _group_size(args, kwargs)
            if multiplier == "group" and group:
                payload *= group
            self.stats.add(kind, payload, group)
        return out

    def pop_stats(self) -> CollectiveStats:
        stats, self.stats = self.stats, CollectiveStats()
        return stats


def _is_dtensor_type(t: type) -> bool:
    return isinstance(t, type) and issubclass(t, DTensor)


def merge_stats(parts: Iterable[CollectiveStats]) -> CollectiveStats:
    out = CollectiveStats()
    for part in parts:
        for kind, s in part.by_kind.items():
            mine = out.by_kind[kind]
            mine.count += s.count
            mine.payload_bytes += s.payload_bytes
            mine.wire_bytes += s.wire_bytes
    return out
