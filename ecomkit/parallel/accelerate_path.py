"""The same loop through Hugging Face Accelerate (the SeqGPT guide teaches it).

On CPU launch with torchrun or ``accelerate launch --multi_gpu``: ``--cpu --num_processes 2`` runs one process.
"""

from __future__ import annotations

from typing import ContextManager

import torch

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.models.optim import build_optimizer, build_scheduler
from ecomkit.parallel.base import StepStats, Strategy, deepspeed_probe_skipped


class AccelerateStrategy(Strategy):
    name = "accelerate"

    def __init__(self, cfg: TrainConfig, env: DistEnv):
        super().__init__(cfg, env)
        self.accelerator = None

    def setup(self, model, total_steps: int) -> None:
        from accelerate import Accelerator  # lazy: optional path; importing accelerate costs ~1 s for every other run
        from accelerate.utils import DistributedDataParallelKwargs  # lazy: as above

        self.grad_accum = self.cfg.resolve_grad_accum(self.env.world_size)
        mp = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[self.cfg.precision]
        self.accelerator = Accelerator(
            cpu=self.env.device.type == "cpu", mixed_precision=mp, gradient_accumulation_steps=self.grad_accum,
            kwargs_handlers=[DistributedDataParallelKwargs(
                bucket_cap_mb=int(self.cfg.bucket_cap_mb), gradient_as_bucket_view=self.cfg.gradient_as_bucket_view)])
        self.raw_model = model
        optimizer = build_optimizer(model, self.cfg)
        scheduler = build_scheduler(optimizer, self.cfg, total_steps)
        # The scheduler is *not* prepared: a prepared scheduler steps num_processes times per step.
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.scheduler = scheduler

    def autocast(self) -> ContextManager:
        return self.accelerator.autocast()

    def micro_step_context(self, is_last: bool) -> ContextManager:
        return self.accelerator.accumulate(self.model)

    def backward(self, loss: torch.Tensor) -> None:
        # accelerator.backward divides by grad_accum; our loss is already normalised for the global batch.
        self.accelerator.backward(loss * self.grad_accum)

    def clip_and_step(self, max_norm: float) -> StepStats:
        norm = self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm if max_norm > 0 else float("inf"))
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(grad_norm=norm, skipped=bool(getattr(self.optimizer, "step_was_skipped", False)))

    def save_pretrained(self, out_dir: str, tokenizer=None) -> None:
        self.accelerator.wait_for_everyone()
        if self.env.is_main:
            with deepspeed_probe_skipped():   # unwrap_model and save_pretrained both probe for DeepSpeed
                self.accelerator.unwrap_model(self.model).save_pretrained(out_dir)
            if tokenizer is not None:
                tokenizer.save_pretrained(out_dir)

    def close(self) -> None:
        if self.accelerator is not None:
            self.accelerator.free_memory()
        self.accelerator = None
        super().close()
