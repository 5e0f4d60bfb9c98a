"""``--loss-kernel`` and ``--loss-chunk-tokens``: part of :func:`~ecomkit.config.validate.validate_train_config`.

Why here: the fused kernels (liger, cce) depend on this machine (a package, a CUDA GPU), so they are refused before
any process group exists, not as a Triton error on the first step.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from ecomkit.config.vocabulary import LOSS_KERNEL_CHOICES, LOSS_KERNEL_PACKAGES, StrategyName, check_choice
from ecomkit.errors import ConfigError

_TrainConfig = Any      # ecomkit.config.schema.TrainConfig (schema imports validate, which imports this module)

# Strategies whose ranks do not end their forward in the whole LM head, so no loss of ecomkit's takes its hidden
# states (the same as ``Strategy.supports_chunked_loss``).
_NO_FORWARD_LOSS = {StrategyName.TP: "tensor parallelism shards the LM head's output over the ranks",
                    StrategyName.PP: "a pipeline's last stage computes its own loss"}


def check_loss_kernel(cfg: _TrainConfig) -> None:
    """The kernel is a known word, agrees with ``--loss-chunk-tokens``, and (liger, cce) can run here."""
    check_choice("loss_kernel", cfg.loss_kernel, LOSS_KERNEL_CHOICES)
    if cfg.loss_kernel == "chunked" and cfg.loss_chunk_tokens == 0:
        raise ConfigError(
            "--loss-kernel chunked with --loss-chunk-tokens 0: the chunked loss needs a number of positions per "
            "chunk, and 0 asks for the full logits. Give --loss-chunk-tokens N (1024 is the default), or use "
            "--loss-kernel full.")
    if cfg.loss_kernel in LOSS_KERNEL_PACKAGES:
        check_fused_kernel(cfg)


def check_fused_kernel(cfg: _TrainConfig) -> None:
    """``liger`` / ``cce``: a strategy whose ranks end their forward in the whole head, the package, a CUDA GPU."""
    kernel = cfg.loss_kernel
    module, pip_name = LOSS_KERNEL_PACKAGES[kernel]
    why_not = forward_loss_unsupported(cfg)
    if why_not is None and kernel == "cce" and cfg.strategy == StrategyName.ZERO and cfg.zero.stage == 3:
        raise ConfigError(
            "--loss-kernel cce cannot run with --strategy zero --zero-stage 3: cut-cross-entropy computes the LM "
            "head's gradient in backward, from the head's weight, which ZeRO-3 has partitioned again by then (it "
            "is gathered for the kernel's forward only). Use --loss-kernel liger (its forward computes the "
            "gradient) or chunked, or --zero-stage 1 or 2.")
    if why_not:
        raise ConfigError(
            f"--loss-kernel {kernel} cannot run with --strategy {cfg.strategy}: a fused linear cross-entropy takes "
            f"the LM head's whole weight after the model's forward, and {why_not}. Use --loss-kernel auto (the "
            "full-logits loss under this strategy), or a strategy that ends each rank's forward in the whole head "
            "(ddp, accelerate, zero, fsdp without tp/pp).")
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"--loss-kernel {kernel} needs the {pip_name} package, which is not installed. Install the GPU extra "
            f"(pip install 'ecomkit[gpu]', or pip install {pip_name}), or use --loss-kernel auto (ecomkit's "
            "chunked loss unless a GPU measurement picked another).")
    if _cuda_available() is False:
        raise ConfigError(
            f"--loss-kernel {kernel} runs {pip_name}'s Triton kernels, which need a CUDA GPU, and torch sees none "
            "here (torch.cuda.is_available() is False). Use --loss-kernel chunked, or auto, which picks the "
            "chunked loss on a CPU.")


def forward_loss_unsupported(cfg: _TrainConfig) -> str | None:
    """Why ``cfg``'s strategy cannot run a loss inside the model's forward, or None where it can (the rule
    ``--loss-kernel auto`` and ``Strategy.supports_chunked_loss`` follow)."""
    why_not = _NO_FORWARD_LOSS.get(cfg.strategy)
    if why_not is None and cfg.strategy in (StrategyName.FSDP, StrategyName.MIXED) and (
            cfg.parallel.tp > 1 or cfg.parallel.pp > 1):
        why_not = f"with --parallel-tp {cfg.parallel.tp} --parallel-pp {cfg.parallel.pp} the head is sharded or staged"
    return why_not


def _cuda_available() -> bool | None:
    """Whether torch sees a CUDA GPU; None in a process that has not imported torch (``ecomkit.config`` imports
    none, and every training process imports it before validating)."""
    torch = sys.modules.get("torch")
    return None if torch is None else bool(torch.cuda.is_available())


__all__ = ["check_fused_kernel", "check_loss_kernel", "forward_loss_unsupported"]
