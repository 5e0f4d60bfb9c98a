"""The checks of ``--loss-kernel`` and ``--peft lora`` (QLoRA too), run by ``TrainConfig.validate`` like the rest.

Why a second file: every check in one module would pass the 400-line limit; these are the options that need an
optional package (liger, cce, peft, bitsandbytes) or a GPU, refused before any process group rather than mid-run.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from ecomkit.config.vocabulary import (LOSS_KERNEL_CHOICES, LOSS_KERNEL_PACKAGES, PEFT_METHODS, StrategyName,
                                       check_choice)
from ecomkit.errors import ConfigError

_TrainConfig = Any      # ecomkit.config.schema.TrainConfig (schema imports validate, which imports this module)


# ---------------------------------------------------------------------- --loss-kernel
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


# ---------------------------------------------------------------------- --peft lora, --lora-base-bits
# Where an adapter-aware layout is missing: the strategy, and what would have to exist for it to work.
LORA_UNSUPPORTED_STRATEGIES = {
    "tp": ("tensor parallelism shards each BLOOM Linear by name with a ColwiseParallel/RowwiseParallel plan, but "
           "after peft injects LoRA those names are peft LoraLayer modules (base_layer + lora_A + lora_B), and "
           "ecomkit has no tensor-parallel plan for them yet (lora_A replicated or sharded like the base input, "
           "lora_B like its output)"),
    "pp": ("pipeline parallelism cuts the model into stages and consolidates the weights per stage by the "
           "plain BLOOM parameter names; ecomkit has no mapping yet for peft's base_layer/lora_A/lora_B names "
           "across stages, nor a per-stage adapter save"),
    "mixed": ("the mixed strategy adds tensor and/or pipeline parallelism to FSDP2, and neither has a LoRA "
              "layout yet (no tensor-parallel plan for peft's LoraLayer modules, no per-stage adapter mapping)"),
}


def check_peft(cfg: _TrainConfig, world_size: int) -> None:
    """``peft`` and its ``lora_*`` fields: values in range, and a strategy that can train adapters."""
    check_choice("peft", cfg.peft, PEFT_METHODS)
    if cfg.peft == "none":
        if cfg.lora_base_bits != 16:
            raise ConfigError(
                f"--lora-base-bits {cfg.lora_base_bits} needs --peft lora: only a frozen base can be stored in "
                "8 or 4 bits (QLoRA), since full fine-tuning updates every weight. Add --peft lora, or drop the flag.")
        return
    if cfg.lora_r < 1:
        raise ConfigError(
            f"--lora-r {cfg.lora_r}: must be >= 1: it is the rank of each adapter's B·A update "
            "(8 to 64 is typical; the adapters hold r × (in + out) weights per adapted Linear).")
    if cfg.lora_alpha <= 0:
        raise ConfigError(
            f"lora_alpha={cfg.lora_alpha} (flag --lora-alpha) must be > 0: the update is scaled by alpha / r, "
            "so 0 or a negative value would switch the adapters off or invert them. 2 × --lora-r is usual.")
    if not 0 <= cfg.lora_dropout < 1:
        raise ConfigError(
            f"lora_dropout={cfg.lora_dropout} (flag --lora-dropout) must be in [0, 1): it is the probability "
            "of dropping each input element of the adapter; 1 would drop them all.")
    if not [m for m in cfg.lora_target_modules.split(",") if m.strip()]:
        raise ConfigError(
            "lora_target_modules is empty (flag --lora-target-modules): LoRA needs at least one Linear to "
            "adapt. BLOOM's are query_key_value,dense,dense_h_to_4h,dense_4h_to_h.")
    reason = LORA_UNSUPPORTED_STRATEGIES.get(cfg.strategy)
    if reason is not None:
        raise ConfigError(
            f"--peft lora cannot run with --strategy {cfg.strategy}: {reason}. Train LoRA with --strategy "
            "ddp, accelerate, zero (stages 0-3, with or without offload) or fsdp; with the frozen base "
            "replicated or sharded the adapters are small enough that data parallelism alone is the usual "
            "choice.")
    if cfg.strategy == "fsdp" and (cfg.parallel.tp > 1 or cfg.parallel.pp > 1):
        raise ConfigError(
            f"--peft lora with --strategy fsdp needs --parallel-tp 1 and --parallel-pp 1 (got tp="
            f"{cfg.parallel.tp}, pp={cfg.parallel.pp}): {LORA_UNSUPPORTED_STRATEGIES['mixed']}.")
    if cfg.lora_modules_to_save.strip() and cfg.strategy in ("fsdp", "zero"):
        raise ConfigError(
            f"--lora-modules-to-save '{cfg.lora_modules_to_save}' with --strategy {cfg.strategy}: peft keeps "
            "a trainable copy of each such module beside the frozen original (ModulesToSaveWrapper), and "
            "for BLOOM's embeddings that copy unties them from the LM head; ecomkit gathers and saves that "
            "layout only from replicated models so far. Use --strategy ddp or accelerate for it, or leave "
            "the flag empty.")
    check_quantized_base(cfg)


def check_quantized_base(cfg: _TrainConfig) -> None:
    """QLoRA (``--lora-base-bits 8|4``): bitsandbytes installed, and a strategy that can wrap its layers."""
    if cfg.lora_base_bits not in (16, 8, 4):
        raise ConfigError(
            f"--lora-base-bits {cfg.lora_base_bits}: 16 (the base in the training dtype), 8 (LLM.int8) or 4 "
            "(NF4, QLoRA) are the choices.")
    if cfg.lora_base_bits == 16:
        return
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(
            f"--lora-base-bits {cfg.lora_base_bits} stores the frozen base with bitsandbytes, which is not "
            "installed. Install the optional extra (pip install 'ecomkit[qlora]', or pip install bitsandbytes); "
            "its CPU backend runs the 8- and 4-bit layers too.")
    if cfg.strategy != "ddp":
        raise ConfigError(
            f"--lora-base-bits {cfg.lora_base_bits} with --strategy {cfg.strategy}: a bitsandbytes weight is a "
            "packed integer tensor with its scales kept beside it (quant_state / SCB), not a parameter the "
            "sharding strategies know: ZeRO-3 and FSDP2 would partition the packed bytes without their "
            "scales, and ecomkit gathers and saves quantized layers only from a replicated model so far. "
            "Train QLoRA with --strategy ddp (one process or several), or use --lora-base-bits 16 under "
            f"{cfg.strategy}.")
    if cfg.precision == "fp16":
        raise ConfigError(
            f"--lora-base-bits {cfg.lora_base_bits} with --precision fp16: use fp32 or bf16, the compute "
            "dtypes ecomkit gives bitsandbytes' layers (fp16's loss scaling is not wired to them).")
