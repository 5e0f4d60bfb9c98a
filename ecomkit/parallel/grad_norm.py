"""The global gradient norm and clipping when gradients are DTensors on several meshes, or split over stages.

Why: FSDP2, TP and PP leave each rank a different piece of the gradient, and torch's ``clip_grad_norm_`` handles one
mesh; this takes one DTensor reduction per (mesh, placements) group, then adds the pipeline stages' squares.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import implicit_replication


def total_grad_norm(grads: Sequence[torch.Tensor], extra_group: Any = None) -> torch.Tensor:
    """L2 norm (float64 scalar) of gradients that may be DTensors on different meshes/placements.

    One reduction per (mesh, placements) group never double-counts replicas; ``extra_group`` also sums over it (stages).
    """
    groups: dict[Any, list[torch.Tensor]] = defaultdict(list)
    for g in grads:
        key = (id(g.device_mesh), tuple(g.placements)) if isinstance(g, DTensor) else None
        groups[key].append(g)
    squares = []
    for members in groups.values():
        norm = torch.nn.utils.get_total_norm(members, 2.0, foreach=False)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares.append(norm.detach().to(torch.float64) ** 2)   # on the gradients' device: no host read
    total_sq = torch.stack(squares).sum() if squares else torch.zeros((), dtype=torch.float64)
    if extra_group is not None:
        dist.all_reduce(total_sq, group=extra_group)
    return total_sq.sqrt()


def clip_gradients_(grads: Sequence[torch.Tensor], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scale gradients like ``torch.nn.utils.clip_grad_norm_``: by ``min(1, max_norm / (norm + 1e-6))``.

    The scale stays a tensor, so the host never waits for the norm; DTensor gradients take it as a replicated scalar.
    """
    if max_norm <= 0 or not grads:
        return
    coef = torch.clamp(max_norm / (total_norm.detach() + 1e-6), max=1.0)
    with implicit_replication():
        for g in grads:
            g.mul_(coef.to(g.device, g.dtype))
