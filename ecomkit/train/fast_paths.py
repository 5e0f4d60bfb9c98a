"""The model's fast paths, installed after it is built and before a strategy wraps it, in one order.

Why one function: each path changes how the same BLOOM computes, never what,
and some depend on another (the chunked loss takes the CPU kernels; ``--compile``
compiles the blocks as the attention and GeLU left them), so the order is
written once:

1. attention (``--attn``; eager too, for its one-pass QKV split): ``models/attention.py``;
2. the AVX-512 GeLU and loss kernels on a CPU (``--cpu-kernels``): ``models/cpu_kernels.py``;
3. BLOOM's GeLU as one kernel each way (``--fused-gelu``): ``models/gelu.py``;
4. the LM-head loss (``--loss-kernel``: chunked, ``--loss-chunk-tokens`` at a time, or a fused library kernel
   on CUDA), where the strategy runs the whole model in one forward: ``models/loss.py``;
5. ``--compile``: one block compiled and reused by every block, the head + loss apart: ``models/compile.py``.
"""

from __future__ import annotations

import torch
from torch import nn

from ecomkit.config import TrainConfig
from ecomkit.models.attention import install_attention
from ecomkit.models.compile import compile_blocks, compiled_head_loss
from ecomkit.models.cpu_kernels import kernels_for
from ecomkit.models.gelu import install_fused_gelu
from ecomkit.models.loss import FUSED_LOSSES, install_chunked_loss, install_fused_loss
from ecomkit.models.precision import length_multiple


def install_fast_paths(model: nn.Module, cfg: TrainConfig, device: torch.device, chunked_loss: bool,
                       packed: bool) -> None:
    """Install the paths above on ``model`` for ``cfg`` on ``device``.

    ``chunked_loss``: whether the strategy can take the chunked loss (``Strategy.supports_chunked_loss``);
    ``packed``: whether every batch has one shape, so ``--compile`` compiles static shapes once.
    """
    install_attention(model, cfg.attn)
    kernels = kernels_for(device, cfg.cpu_kernels)
    install_fused_gelu(model, cfg.fused_gelu, kernels)
    # --loss-kernel, resolved by train/resolve.loss_kernel_choice ("auto" left here: the chunked loss)
    if chunked_loss and cfg.loss_kernel in FUSED_LOSSES:   # validate() checked the package and the GPU
        install_fused_loss(model, cfg.loss_kernel)
    elif chunked_loss and cfg.loss_kernel in ("chunked", "auto") and cfg.loss_chunk_tokens > 0:
        # no [B, T, vocab] logits; bf16 on CPU: bounded shapes
        install_chunked_loss(model, cfg.loss_chunk_tokens, length_multiple(cfg.precision, device), kernels,
                             compiled_head_loss(cfg.compile_mode) if cfg.compile else None)
    if cfg.compile:
        compile_blocks(model, cfg.compile_mode, dynamic=not packed)


__all__ = ["install_fast_paths"]
