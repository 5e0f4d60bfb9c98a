"""Count the bytes a DDP communication hook hands to collectives (chapter 05).

A process-group wrapper sees every collective a hook issues, even torch's own hooks from future callbacks. It counts
each rank's payload; :meth:`ByteCounter.wire_estimate` converts to ring traffic.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class ByteCounter:
    """Thread-safe running totals, popped once per optimizer step (hook callbacks may run on gloo threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.allreduce_bytes = 0
        self.allgather_bytes = 0
        self.collectives = 0
        self.dense_bytes = 0      # what an uncompressed all-reduce of the same buckets would send
        self.buckets = 0

    def add(self, kind: str, nbytes: int) -> None:
        with self._lock:
            setattr(self, f"{kind}_bytes", getattr(self, f"{kind}_bytes") + nbytes)
            self.collectives += 1

    def add_dense(self, bucket_buffer: torch.Tensor) -> None:
        with self._lock:
            self.dense_bytes += tensor_bytes(bucket_buffer)
            self.buckets += 1

    @property
    def sent_bytes(self) -> int:
        return self.allreduce_bytes + self.allgather_bytes

    def wire_estimate(self, world_size: int) -> float:
        """Bytes one rank puts on the wire with ring all-reduce and ring all-gather."""
        n = world_size
        return self.allreduce_bytes * 2 * (n - 1) / n + self.allgather_bytes * (n - 1)

    def pop(self, world_size: int) -> dict[str, Any]:
        """Totals since the last pop, as metrics-row fields; resets the counter."""
        with self._lock:
            row = {
                "comm_bytes": self.sent_bytes,
                "comm_bytes_dense": self.dense_bytes,
                "compression_ratio": (self.dense_bytes / self.sent_bytes) if self.sent_bytes else None,
                "comm_allreduce_bytes": self.allreduce_bytes,
                "comm_allgather_bytes": self.allgather_bytes,
                "comm_wire_bytes_est": self.wire_estimate(world_size),
                "comm_collectives": self.collectives,
                "comm_buckets": self.buckets,
            }
            self.reset()
        return row


class CountingProcessGroup:
    """A ``ProcessGroup`` stand-in that counts ``allreduce``/``allgather`` payloads and forwards everything else."""

    def __init__(self, group: dist.ProcessGroup | None, counter: ByteCounter):
        self._group = group if group is not None else dist.group.WORLD
        self.counter = counter

    def allreduce(self, tensors, *args, **kwargs):
        self.counter.add("allreduce", sum(tensor_bytes(t) for t in _flat(tensors)))
        return self._group.allreduce(tensors, *args, **kwargs)

    def allgather(self, output_tensors, input_tensors, *args, **kwargs):
        self.counter.add("allgather", sum(tensor_bytes(t) for t in _flat(input_tensors)))
        return self._group.allgather(output_tensors, input_tensors, *args, **kwargs)

    def size(self) -> int:
        return self._group.size()

    def rank(self) -> int:
        return self._group.rank()

    def __getattr__(self, name: str) -> Any:  # only called for attributes not defined above
        return getattr(self._group, name)


def _flat(tensors) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    out: list[torch.Tensor] = []
    for t in tensors:
        out.extend(_flat(t))
    return out
