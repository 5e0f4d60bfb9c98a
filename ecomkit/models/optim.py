"""AdamW with decoupled weight decay, and a warm-up + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from ecomkit.config import TrainConfig


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
    # foreach=False keeps the update order identical across world sizes, which
    # the equivalence tests rely on (fp32 bit-for-bit within 1e-6).
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                             betas=(cfg.beta1, cfg.beta2), eps=1e-8, foreach=False)


def lr_at(step: int, cfg: TrainConfig, total_steps: int) -> float:
    """Multiplier of the peak lr at ``step``: linear warm-up, then cosine to ``min_lr_ratio``."""
    if cfg.warmup_steps and step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_at(s, cfg, total_steps))
