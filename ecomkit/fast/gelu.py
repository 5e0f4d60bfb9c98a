"""BLOOM's MLP activation as one ATen kernel each way: ``F.gelu(x, approximate="tanh")``.

Why: transformers' ``BloomGelu`` is Python tensor arithmetic (about 8 kernels forward, 12 backward over the
``[batch, T, 4 × hidden]`` activation); ATen computes the same function in one fp32 pass. Only the modules' class
changes; ``--no-fused-gelu`` keeps transformers' own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.bloom.modeling_bloom import BloomGelu

from ecomkit.fast.cpu_kernels import gelu_tanh


class FusedBloomGelu(BloomGelu):
    """``BloomGelu`` computed by ATen's tanh-approximate GELU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


class KernelBloomGelu(FusedBloomGelu):
    """``FusedBloomGelu`` through ecomkit's AVX-512 kernel on plain CPU tensors, else ATen's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh(x, use_kernel=True)


def install_fused_gelu(model: nn.Module, enabled: bool = True, cpu_kernel: bool = False) -> int:
    """Switch every BLOOM GeLU of ``model`` to the fused one (``cpu_kernel``: ecomkit's CPU kernel) or back; returns
    how many modules were switched (0 for other models)."""
    modules = [m for m in model.modules() if isinstance(m, BloomGelu)]
    cls = (KernelBloomGelu if cpu_kernel else FusedBloomGelu) if enabled else BloomGelu
    for m in modules:
        m.__class__ = cls
    return len(modules)


__all__ = ["FusedBloomGelu", "KernelBloomGelu", "install_fused_gelu"]
