"""Data parallelism with ``DistributedDataParallel`` (chapter 02).

Why DDP: its bucketed all-reduce overlaps the backward pass (the correct "async all-reduce on a side stream"), and
``no_sync()`` reduces once per optimizer step under accumulation.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ContextManager

from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ecomkit import find
from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.parallel import DDP_HOOKS
from ecomkit.parallel.base import StepStats, Strategy

if TYPE_CHECKING:
    from ecomkit.parallel.compression.hooks import CompressionHook, InactiveCompression


def apply_ddp(model: nn.Module, env: DistEnv, bucket_cap_mb: float = 25.0,
              gradient_as_bucket_view: bool = True) -> nn.Module:
    """``model`` in DDP (as it is for one process); ``gradient_as_bucket_view`` saves a gradient-sized copy per rank."""
    if not env.distributed:
        return model
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    return DDP(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb,
               gradient_as_bucket_view=gradient_as_bucket_view)


class DDPStrategy(Strategy):
    """Replicated model, bucketed all-reduce, ``no_sync`` for accumulation."""

    name = "ddp"
    has_ddp_hooks = True

    def __init__(self, cfg: TrainConfig, env: DistEnv):
        super().__init__(cfg, env)
        self.comm_hook: "CompressionHook | InactiveCompression | None" = None  # set when compression is configured
        self.allreduce: Any = None   # another gradient all-reduce, from the fast paths (--ddp-allreduce shm):
                                     #   .register(ddp_model, env) once wrapped, .release() in close()

    def wrap(self, model: nn.Module) -> nn.Module:
        wrapped = apply_ddp(model, self.env, self.cfg.bucket_cap_mb, self.cfg.gradient_as_bucket_view)
        if self.cfg.compression.method != "none":
            self.comm_hook = find(DDP_HOOKS["compression"])(wrapped, self.cfg.compression, self.env)
        if self.allreduce is not None and isinstance(wrapped, DDP):  # one process: nothing to reduce
            self.allreduce.register(wrapped, self.env)
        return wrapped

    def micro_step_context(self, is_last: bool) -> ContextManager:
        if is_last or not isinstance(self.model, DDP):
            return contextlib.nullcontext()
        return self.model.no_sync()

    def clip_and_step(self, max_norm: float) -> StepStats:
        stats = super().clip_and_step(max_norm)
        if self.comm_hook is not None:
            stats.extra.update(self.comm_hook.pop_step_stats())
        return stats

    def close(self) -> None:
        if self.allreduce is not None:
            self.allreduce.release()
        super().close()
