"""The words a config may use: strategy names, precisions, tasks, schedules; and the one "unknown X" message.

Why a module of its own: planner, loop, registry and sweeps spell strategies alike, without needing each other.
"""

from __future__ import annotations

from enum import Enum

from ecomkit.errors import ConfigError, did_you_mean


class StrategyName(str, Enum):
    """The one vocabulary of training strategies: what ``--strategy`` takes.
    A ``str`` enum, so configs, JSON files and flags keep plain strings; the planner's names ("zero2", "fsdp2") are
    :func:`plan_strategy_name` and :func:`parse_plan_strategy`."""

    DDP = "ddp"
    ACCELERATE = "accelerate"
    ZERO = "zero"
    FSDP = "fsdp"
    TP = "tp"
    PP = "pp"
    MIXED = "mixed"

    def __str__(self) -> str:
        return self.value


STRATEGIES = tuple(s.value for s in StrategyName)
# Strategies that wrap the model in torch DDP, the only wrapper with communication hooks (chapter 05).
HOOK_STRATEGIES = frozenset({StrategyName.DDP})
# Strategies whose wrapped model ecomkit hands to torch.compile (--compile); the others are refused in validate().
COMPILE_STRATEGIES = frozenset({StrategyName.DDP})
# Strategies built on a (pp, dp, tp) device mesh (chapter 04): their degrees come from ``cfg.parallel``.
MESH_STRATEGIES = (StrategyName.FSDP, StrategyName.TP, StrategyName.PP, StrategyName.MIXED)
# --report-to: where every metrics.jsonl row is also logged (ecomkit.reporting), and the package each needs.
REPORT_TARGETS = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "none": None}

# Why a strategy's state is not one DCP state dict of (model, optimizer): chapter 07's checkpoints skip it.
STRATEGIES_WITHOUT_DCP = {
    StrategyName.ZERO: "DeepSpeed keeps its own sharded engine state (use --zero-checkpoint-interval, "
                       "ecomkit.parallel.zero.checkpoint)",
}

# The planner plans one memory layout per name: ZeRO is split by stage, FSDP is FSDP2.
PLAN_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp2", "tp", "pp")
DEEPSPEED_PLAN_STRATEGIES = ("zero1", "zero2", "zero3")
PLAN_STRATEGY_ALIASES = {"zero0": "ddp", "zero-0": "ddp", "zero-1": "zero1", "zero-2": "zero2", "zero-3": "zero3",
                         "fsdp": "fsdp2", "dp": "ddp", "accelerate": "ddp"}

PRECISIONS = ("fp32", "bf16", "fp16")
# What --precision accepts: a precision, or "auto" (resolved once the device is known: models/precision.py).
PRECISION_CHOICES = (*PRECISIONS, "auto")
TASKS = ("lm", "nlu")
CLIP_POLICIES = ("fixed", "sentiment")
ATTN_IMPLS = ("eager", "sdpa", "flex")
# What --attn accepts: an implementation, or "auto" (resolved once precision and device are known: models/attention.py).
ATTN_CHOICES = (*ATTN_IMPLS, "auto")
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk", "topk_naive")
# How DDP moves gradients: the process group's all-reduce, or shared memory between ranks on one CPU host.
DDP_ALLREDUCES = ("process_group", "shm")
PP_SCHEDULES = ("gpipe", "1f1b")
# How pipeline stages divide the blocks (ecomkit.parallel.pipeline.stage_layer_ranges).
PP_BALANCES = ("layers", "compute")
ZERO_STAGES = (0, 1, 2, 3)
# NLU prompt layouts (ecomkit.data.formats) and span-list end conventions (ecomkit.data.spans).
PROMPT_FORMATS = ("seqgpt", "ecomgpt", "ecomkit")
SPAN_ENDS = ("exclusive", "inclusive")
PEFT_METHODS = ("none", "lora")
# --compile-mode: torch.compile's mode for the compiled blocks and loss (fast/compile.py); "default" passes none.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
# --loss-kernel: ecomkit's chunked loss, transformers' full logits, or a fused library kernel on CUDA (models/loss.py).
LOSS_KERNELS = ("chunked", "full", "liger", "cce")
LOSS_KERNEL_CHOICES = (*LOSS_KERNELS, "auto")
# The fused kernels' packages: kernel -> (import name, pip name); Triton, so CUDA only (the ``gpu`` extra).
LOSS_KERNEL_PACKAGES = {"liger": ("liger_kernel", "liger-kernel"), "cce": ("cut_cross_entropy", "cut-cross-entropy")}
# --packing: rows packed into full sequences (data/packing.py), or not, or decided from the data's lengths.
PACKING_CHOICES = ("auto", "on", "off")
# The word that --seq-len and --gen-max-new-tokens take instead of a number: chosen from the data (data/lengths.py).
AUTO = "auto"

# Each fixed-list field's allowed values, by dotted name: the CLI's metavar and help; validate() enforces them.
FIELD_CHOICES: dict[str, tuple] = {
    "attn": ATTN_CHOICES, "task": TASKS, "clip_policy": CLIP_POLICIES, "precision": PRECISION_CHOICES,
    "strategy": STRATEGIES, "zero.stage": ZERO_STAGES, "compression.method": COMPRESSIONS,
    "parallel.pp_schedule": PP_SCHEDULES, "parallel.pp_balance": PP_BALANCES, "prompt_format": PROMPT_FORMATS, "span_end": SPAN_ENDS,
    "peft": PEFT_METHODS, "ddp_allreduce": DDP_ALLREDUCES, "packing": PACKING_CHOICES,
    "compile_mode": COMPILE_MODES, "loss_kernel": LOSS_KERNEL_CHOICES,
}


def flag_of(name: str) -> str:
    """The command-line flag of a config field: ``seq_len`` -> ``--seq-len``, ``zero.stage`` -> ``--zero-stage``."""
    return "--" + name.replace(".", "-").replace("_", "-")


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """Raise "Unknown <name> '<value>' (--flag). Choose one of: ... Did you mean ...?" unless ``value`` is allowed."""
    if value not in allowed:
        hint = did_you_mean(value, allowed)
        flag = f" ({flag_of(name)})" if " " not in name else ""   # "planner strategy" is not a config field
        raise ConfigError(f"Unknown {name} '{value}'{flag}. Choose one of: {', '.join(allowed)}.{hint}")


def plan_strategy_name(strategy: str, zero_stage: int = 0) -> str:
    """The planner's name for a training strategy: ("zero", 2) -> "zero2", "fsdp" -> "fsdp2", ("zero", 0) -> "ddp"."""
    s = StrategyName(strategy)
    if s is StrategyName.ZERO:
        return "ddp" if zero_stage == 0 else f"zero{zero_stage}"
    if s is StrategyName.FSDP:
        return "fsdp2"
    if s is StrategyName.ACCELERATE:
        return "ddp"
    if s is StrategyName.MIXED:
        raise ConfigError("The planner plans one strategy at a time; plan 'mixed' as tp, pp or fsdp2.")
    return s.value


def parse_plan_strategy(name: str) -> tuple[StrategyName, int]:
    """Read a planner name back: "zero3" -> (ZERO, 3), "fsdp2" -> (FSDP, 0), "zero-1" -> (ZERO, 1)."""
    key = PLAN_STRATEGY_ALIASES.get(str(name).lower(), str(name).lower())
    check_choice("planner strategy", key, PLAN_STRATEGIES)
    if key in DEEPSPEED_PLAN_STRATEGIES:
        return StrategyName.ZERO, int(key.removeprefix("zero"))
    return (StrategyName.FSDP, 0) if key == "fsdp2" else (StrategyName(key), 0)
