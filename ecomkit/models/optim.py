"""AdamW with decoupled weight decay, and a warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from ecomkit.config import TrainConfig
from ecomkit.config.recipe import mechanics_value


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases, LayerNorms and embeddings (the usual GPT recipe)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or "embeddings" in name or "ln" in name.split(".")[-2:][0] else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # Frozen parameters are left out (LoRA: only the adapters train), so a group can be empty; DeepSpeed drops
    # empty groups, which would leave the lr scheduler with one lambda too many.
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay)
    # a run resolved --lr auto already (train/resolve.py); a model trained by hand gets the mechanics' lr
    return torch.optim.AdamW(groups, lr=mechanics_value("lr", cfg.lr), betas=(cfg.beta1, cfg.beta2), eps=1e-8,
                             **adamw_kernel(groups))


def adamw_kernel(groups: list[dict]) -> dict[str, bool]:
    """``fused=True`` where every parameter is a plain floating tensor on CPU or CUDA, else ``foreach=False``.
    Why fused: one ATen kernel per parameter instead of ~8 elementwise ops; DTensors (FSDP2, TP) keep the
    per-tensor loop, which every torch build runs on them."""
    params = [p for g in groups for p in g["params"]]
    plain = all(type(p) in (nn.Parameter, torch.Tensor) and p.is_floating_point()
                and p.device.type in ("cpu", "cuda") for p in params)
    return {"fused": True} if plain else {"foreach": False}


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (``max_norm <= 0``: only measure), never reading the norm on the host.
    Why: ``float(norm)`` makes the host wait for the GPU's backward; the scale ``min(1, max_norm / (norm + 1e-6))``
    is applied on the device (exactly 1.0 below ``max_norm``). Returns torch's total norm as a tensor."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    if max_norm > 0 and grads:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


class WarmupCosine:
    """The lr multiplier of a step: linear warm-up, then cosine to ``min_lr_ratio`` at ``total_steps``.
    An object, not a lambda, so a shortened run moves the cosine's end and a checkpoint keeps the length."""

    def __init__(self, warmup: int, total_steps: int, min_lr_ratio: float):
        self.warmup, self.total_steps, self.min_lr_ratio = int(warmup), int(total_steps), float(min_lr_ratio)

    def __call__(self, step: int) -> float:
        if self.warmup and step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total_steps - self.warmup))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    schedule = WarmupCosine(mechanics_value("warmup_steps", cfg.warmup_steps), total_steps, cfg.min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def set_schedule_length(scheduler: object, total_steps: int) -> None:
    """Move the cosine's end of ``scheduler`` (ours, or Accelerate's wrapper around ours) to ``total_steps``."""
    while not hasattr(scheduler, "lr_lambdas"):
        scheduler = scheduler.scheduler   # accelerate's AcceleratedScheduler keeps ours as .scheduler
    for schedule in scheduler.lr_lambdas:
        schedule.total_steps = int(total_steps)
