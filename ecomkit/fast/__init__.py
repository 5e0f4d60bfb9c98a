"""The speed-ups of a training step, each behind its flag, installed by one call; none changes what BLOOM computes.

Why one call: some paths depend on another (the chunked loss takes the CPU kernels, ``--compile`` compiles the
blocks as attention and GeLU left them), so their order is written once, in :func:`install_fast_paths`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ecomkit import find
from ecomkit.config import TrainConfig
from ecomkit.fast.attention import install_attention
from ecomkit.fast.cpu_kernels import install_fused_gelu, kernel_cross_entropy_sum, kernels_for
from ecomkit.models.loss import TokenLoss, cross_entropy_sum, head_loss_sum
from ecomkit.models.precision import length_multiple

COMPILE = "ecomkit.fast.compile"                            # --compile
SHM_ALLREDUCE = "ecomkit.fast.shm_allreduce:ShmAllReduce"   # --ddp-allreduce shm


def install_fast_paths(model: nn.Module, cfg: TrainConfig, device: torch.device, strategy: Any,
                       packed: bool) -> None:
    """Install ``--attn``, the fused GeLU, ``strategy``'s token loss, ``--compile`` (static shapes when ``packed``)
    and ``--ddp-allreduce shm``, in that order; the last two load only when their flag asks."""
    install_attention(model, cfg.attn)
    kernels = kernels_for(device, cfg.cpu_kernels)
    install_fused_gelu(model, cfg.fused_gelu, kernels)
    strategy.token_loss = token_loss_for(cfg, device, kernels) if strategy.supports_chunked_loss else TokenLoss()
    if cfg.compile:
        find(f"{COMPILE}:compile_blocks")(model, cfg.compile_mode, dynamic=not packed)
    if cfg.ddp_allreduce == "shm":   # validate() allows it under DDP only
        strategy.allreduce = find(SHM_ALLREDUCE)()


def token_loss_for(cfg: TrainConfig, device: torch.device, cpu_kernel: bool) -> TokenLoss:
    """The run's :class:`TokenLoss`: ``--loss-kernel`` as resolved (``auto`` left: chunked), ``--loss-chunk-tokens
    0``: the full logits; under bf16 on CPU the head's rows on a ladder (models/precision.length_multiple)."""
    kernel = "chunked" if cfg.loss_kernel == "auto" else cfg.loss_kernel
    if kernel == "chunked" and cfg.loss_chunk_tokens == 0:
        kernel = "full"
    compiled = cfg.compile and kernel == "chunked"
    head_loss = find(f"{COMPILE}:compiled_head_loss")(cfg.compile_mode) if compiled else head_loss_sum
    return TokenLoss(kernel, cfg.loss_chunk_tokens, length_multiple(cfg.precision, device),
                     kernel_cross_entropy_sum if cpu_kernel else cross_entropy_sum, head_loss)


__all__ = ["COMPILE", "SHM_ALLREDUCE", "install_fast_paths", "token_loss_for"]
