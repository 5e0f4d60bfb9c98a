"""ecomkit's fused CPU kernels (``csrc/cpu_kernels.cpp``): BLOOM's tanh GELU and the LM head's cross-entropy.

Why: on a CPU with AMX bf16 matmuls the elementwise work decides the step, and ATen's tanh GELU does not vectorise
and its cross-entropy takes five passes. Built once per environment, CPU and torch with the machine's compiler;
without a compiler or AVX-512, or under compile, DTensor or GPU, ATen's kernels run.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import platform
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import cpp_extension
from transformers.models.bloom.modeling_bloom import BloomGelu

from ecomkit.hardware import extensions_dir

log = logging.getLogger("ecomkit")

SOURCE = Path(__file__).parent / "csrc" / "cpu_kernels.cpp"
DTYPES = (torch.float32, torch.bfloat16)


def cpu_tag() -> str:
    """This CPU's model and instruction-set flags and the torch version, hashed: one build each (-march=native)."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else platform.processor()
    lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags", "Features"))][:2]
    return hashlib.sha1("\n".join([*lines, torch.__version__]).encode()).hexdigest()[:10]


class KernelStatus(NamedTuple):
    """Whether the kernels are loaded in this process, whether they are the AVX-512 build, and a one-line reason."""

    available: bool
    reason: str
    vectorized: bool = False


@functools.lru_cache(maxsize=1)
def load_cpu_kernels() -> KernelStatus:
    """Build (once per environment and CPU) and load the kernels; the answer is kept for the process."""
    name = f"ecomkit_cpu_kernels_{cpu_tag()}"
    folder = extensions_dir() / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(name=name, sources=[str(SOURCE)], build_directory=str(folder), is_python_module=False,
                           extra_cflags=["-O3", "-march=native", "-fopenmp-simd"], verbose=False)
    except Exception as exc:  # no compiler, no headers, a failed build: ATen's kernels run instead
        cause = str(exc).strip().splitlines()
        return KernelStatus(False, f"not built ({type(exc).__name__}: {cause[0] if cause else ''}); "
                                   "ATen's kernels run instead")
    width = int(torch.ops.ecomkit.vector_width())
    if width < 16:  # the scalar build: correct, but slower than ATen's vectorised kernels
        return KernelStatus(True, "this CPU has no AVX-512, which the kernels are written for; ATen's kernels "
                                  "run instead", vectorized=False)
    return KernelStatus(True, f"AVX-512 build in {folder}", vectorized=True)


def kernels_for(device: torch.device, enabled: bool) -> bool:
    """Whether a run on ``device`` uses the kernels (``--cpu-kernels``); logs which, and why not when it asked."""
    if not enabled or device.type != "cpu":
        return False
    status = load_cpu_kernels()
    (log.info if status.vectorized else log.warning)("cpu kernels (GeLU, loss): %s", status.reason)
    return status.vectorized


def kernel_applies(x: torch.Tensor) -> bool:
    """A plain CPU tensor of a supported dtype, outside torch.compile and torch.export, with the kernels loaded."""
    return (type(x) is torch.Tensor and x.device.type == "cpu" and x.dtype in DTYPES
            and not torch.compiler.is_compiling() and not torch.compiler.is_exporting()
            and load_cpu_kernels().available)


class GeluTanh(torch.autograd.Function):
    """``F.gelu(x, approximate="tanh")`` through the fused kernel, forward and backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return torch.ops.ecomkit.gelu_tanh(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return torch.ops.ecomkit.gelu_tanh_backward(grad.to(x.dtype), x)


class CrossEntropySum(torch.autograd.Function):
    """``F.cross_entropy(logits.float(), target, ignore_index=-100, reduction="sum")`` through the fused kernel.
    Why: it keeps the logits and one fp32 log-sum-exp per row, where ATen keeps an fp32 log-softmax."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss, lse = torch.ops.ecomkit.cross_entropy_sum(logits, target)
        ctx.save_for_backward(logits, target, lse)
        return loss

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, target, lse = ctx.saved_tensors
        return torch.ops.ecomkit.cross_entropy_sum_backward(grad.float(), logits, target, lse), None


def gelu_tanh(x: torch.Tensor, use_kernel: bool) -> torch.Tensor:
    """BLOOM's GELU: the fused kernel where it applies, else ATen's."""
    if use_kernel and kernel_applies(x):
        return GeluTanh.apply(x)
    return F.gelu(x, approximate="tanh")


def cross_entropy_sum(logits: torch.Tensor, target: torch.Tensor, use_kernel: bool) -> torch.Tensor:
    """Σ of the rows' next-token losses (target -100 adds 0), in fp32: the fused kernel where it applies."""
    if use_kernel and kernel_applies(logits) and logits.dim() == 2:
        return CrossEntropySum.apply(logits, target)
    return F.cross_entropy(logits.float(), target, ignore_index=-100, reduction="sum")


def kernel_cross_entropy_sum(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """:func:`cross_entropy_sum` through the kernel where it applies: what the chunked loss takes (``TokenLoss``)."""
    return cross_entropy_sum(logits, target, use_kernel=True)



# ---------------------------------------------------------------------- BLOOM's GeLU (--fused-gelu)
# Why: transformers' BloomGelu is Python tensor arithmetic (about 8 kernels forward, 12 backward); ATen and
# the kernel above compute the same function in one pass. Only the modules' class changes.
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


__all__ = ["KernelStatus", "load_cpu_kernels", "kernels_for", "gelu_tanh", "cross_entropy_sum",
           "kernel_cross_entropy_sum", "FusedBloomGelu", "KernelBloomGelu", "install_fused_gelu"]
