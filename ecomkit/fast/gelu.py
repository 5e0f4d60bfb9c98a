"""BLOOM's MLP activation as one ATen kernel each way: ``F.gelu(x, approximate="tanh")``.

Why: transformers' ``BloomGelu`` is the tanh approximation of GELU written as
Python tensor arithmetic inside a custom autograd Function: about 8
elementwise kernels in the forward and 12 in the backward over the
``[batch, T, 4 × hidden]`` activation, each one more pass over memory (and,
under bf16 autocast, one more rounding to bf16). Measured with
``torch.profiler`` on ``small``, bf16, micro-batch 8, seq 128, one thread of
a 2-core Xeon with AMX, where the matmuls are fast: the GeLU's forward and
backward took 25 % of the step, more than all the matmuls of the forward.
ATen's ``gelu(approximate="tanh")`` is the same function,
``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, in one vectorised pass
that computes in fp32 and rounds once, with its own fused backward.

The same values as transformers' within rounding (its constant is
``0.79788456``; ATen uses ``sqrt(2/pi)`` to full precision), tested in
``tests/test_models.py``. How it is installed: like the attention, only the
modules' class changes (no parameters; ``state_dict`` and ``save_pretrained``
are untouched), before or after a wrapper. ``--no-fused-gelu`` keeps
transformers' own.
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
    """``FusedBloomGelu`` through ecomkit's AVX-512 kernel on plain CPU tensors (``fast/cpu_kernels.py``), else ATen's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh(x, use_kernel=True)


def install_fused_gelu(model: nn.Module, enabled: bool = True, cpu_kernel: bool = False) -> int:
    """Switch every BLOOM GeLU of ``model`` to the fused one (``cpu_kernel``: ecomkit's CPU kernel) or back.

    Returns how many modules were switched; 0 for other models.
    """
    modules = [m for m in model.modules() if isinstance(m, BloomGelu)]
    cls = (KernelBloomGelu if cpu_kernel else FusedBloomGelu) if enabled else BloomGelu
    for m in modules:
        m.__class__ = cls
    return len(modules)


__all__ = ["FusedBloomGelu", "KernelBloomGelu", "install_fused_gelu"]
