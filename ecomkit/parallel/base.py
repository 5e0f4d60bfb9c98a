"""The strategy interface the one training loop talks to: wrap, synchronise, step, gather and save.

``backward`` gets a loss already normalised for the global batch (``world_size × Σ token losses / global label
tokens``), so the ranks' average is the exact global-mean gradient: strategies must not rescale it.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field, replace
from typing import Any, ContextManager, Iterator

import torch
from torch import nn

from ecomkit import find
from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv
from ecomkit.models.attention import attention_mask_for
from ecomkit.models.bloom import ModelSource, count_parameters, load_model
from ecomkit.models.loss import TokenLoss, last_hidden_state, token_loss_sum
from ecomkit.models.optim import build_optimizer, build_scheduler, clip_grad_norm
from ecomkit.models.precision import autocast_context, build_grad_scaler
from ecomkit.parallel import LORA, QUANT, STATE_BYTES


@dataclass
class StepStats:
    """What a strategy reports about one optimizer step (merged into the metrics row)."""

    grad_norm: float | torch.Tensor  # a tensor where the strategy kept it on the device (read at the log interval)
    skipped: bool = False            # fp16 overflow: the step was skipped by the loss scaler
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. bytes_sent by a compression hook


class Strategy:
    """Base class: a single process without any wrapper (also the world-size-1 fallback)."""

    name = "single"
    has_ddp_hooks = False            # gradient compression needs DDP communication hooks
    replicated = True                # every rank holds the full model (DDP); False for ZeRO-3/FSDP/TP/PP
    owns_forward_backward = False    # True: the loop calls forward_backward() once per step (pipelines)
    supports_chunked_loss = True     # each rank's forward ends in the whole LM head (not TP's shards, not PP's stages)
    token_loss = TokenLoss()         # the run's loss from hidden states (the fast paths give it); default: full logits

    def __init__(self, cfg: TrainConfig, env: DistEnv):
        self.cfg, self.env = cfg, env
        self.model: nn.Module | None = None
        self.raw_model: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.scaler: Any = None                   # fp16 dynamic loss scaler

    def build_model(self, source: ModelSource) -> nn.Module:
        """The model materialised whole on every rank; sharding strategies override it (ZeRO-3, FSDP2/TP: meta)."""
        source = self.in_weight_dtype(source)
        return load_model(source.name_or_path, vocab_size=source.vocab_size, device=self.env.device,
                          seed=source.seed, dtype=source.dtype)

    def weight_dtype(self) -> torch.dtype:
        """The dtype weights train and load in: fp32 whatever the compute precision; a LoRA base under bf16 in bf16."""
        if self.cfg.peft == "none":
            return torch.float32
        return find(f"{LORA}:frozen_base_dtype")(self.cfg) or torch.float32   # LoRA's module, only under LoRA

    def in_weight_dtype(self, source: ModelSource) -> ModelSource:
        """``source`` with its dtype decided: its own when it names one, else :meth:`weight_dtype`."""
        return source if source.dtype is not None else replace(source, dtype=self.weight_dtype())

    def parameter_count(self, model: nn.Module) -> int:
        """Ψ of the model :meth:`build_model` returned (meta tensors count their full size)."""
        return count_parameters(model)

    def setup(self, model: nn.Module, total_steps: int) -> None:
        """Wrap ``model`` and build optimizer + scheduler. Subclasses usually override ``wrap``."""
        self.raw_model = model
        self.model = self.wrap(model)   # --compile compiled its blocks before (fast/compile.py), not the wrapper
        self.optimizer = build_optimizer(self.model, self.cfg)
        self.scheduler = build_scheduler(self.optimizer, self.cfg, total_steps)
        self.scaler = build_grad_scaler(self.cfg.precision, self.env.device)

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def data_shard(self) -> tuple[int, int]:
        """(shard index, number of shards) of the data: tp/pp ranks of one model copy share their dp coordinate."""
        return self.env.rank, self.env.world_size

    def micro_step_context(self, is_last: bool) -> ContextManager:
        """Context for one micro-step; DDP returns ``no_sync()`` on all but the last."""
        return contextlib.nullcontext()

    def autocast(self) -> ContextManager:
        """Autocast for bf16/fp16 where the device supports it; fp32 runs without it."""
        return autocast_context(self.cfg.precision, self.env.device)

    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of one batch; ``positions`` (1-D): only those, as evaluation reads a few answer positions."""
        keep = 0 if positions is None else positions   # 0: every position (transformers' default)
        with self.autocast():
            return self.model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits

    def forward_loss_sum(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Σ token losses of one micro-batch: BLOOM's forward to its last hidden states, then :attr:`token_loss`."""
        mask = attention_mask_for(batch)
        if self.token_loss.from_logits:    # transformers' logits, then the loss
            return token_loss_sum(self.forward_logits(batch["input_ids"], mask), batch["labels"])
        with self.autocast():
            hidden = last_hidden_state(self.model, batch["input_ids"], mask)
            with self.lm_head() as head:
                return self.token_loss(hidden, head, batch["labels"], batch.get("label_count"))

    def lm_head(self) -> ContextManager[nn.Module]:
        """The LM head module the loss calls, whole for the length of the loss's forward (ZeRO-3 gathers it)."""
        return contextlib.nullcontext(self.raw_model.lm_head)

    def forward_backward(self, micro_batches: list[dict], loss_scale: float | torch.Tensor) -> torch.Tensor:
        """Whole-step forward+backward for strategies that own the schedule (pipelines); the token-loss sum."""
        raise NotImplementedError(f"strategy {self.name} does not own forward/backward")

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def clip_and_step(self, max_norm: float) -> StepStats:
        """Clip (``max_norm <= 0``: only measure), step optimizer and scheduler, zero grads; fp16 overflow skips."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = clip_grad_norm(params, max_norm)  # torch's, minus its multiply by 1.0 (models/optim.py)
        skipped = False
        if self.scaler is not None:
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < before
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(grad_norm=norm, skipped=skipped)

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def save_pretrained(self, out_dir: str, tokenizer: Any | None = None) -> None:
        """Consolidated Hugging Face directory (safetensors), written by rank 0."""
        if self.env.is_main:
            with deepspeed_probe_skipped():
                self.raw_model.save_pretrained(out_dir)
            if tokenizer is not None:
                tokenizer.save_pretrained(out_dir)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole model's weights on rank 0 (a collective for sharding strategies; they override it)."""
        if not self.env.is_main:
            return None
        if self.cfg.peft != "none" and find(f"{QUANT}:has_quantized_base")(self.raw_model):
            return find(f"{QUANT}:dequantized_state_dict")(self.raw_model)   # QLoRA: the weights it computes with
        return {k: v.detach().float().cpu() for k, v in self.raw_model.state_dict().items()}

    def save_peft(self, out_dir: str, tokenizer: Any | None = None) -> None:
        """``<out_dir>/adapter`` (PEFT format) + ``<out_dir>/final`` (merged), from the gathered weights, by rank 0."""
        state = self.full_state_dict()
        if self.env.is_main:
            with deepspeed_probe_skipped():
                find(f"{LORA}:save_peft_outputs")(state, self.raw_model.config, self.cfg, out_dir, tokenizer)
        if self.env.distributed:
            torch.distributed.barrier()

    def memory_report(self) -> dict[str, int]:
        """Bytes of params / grads / optimizer states held by this rank (counted tensors)."""
        return find(f"{STATE_BYTES}:model_state_bytes")(self.model, self.optimizer)

    def close(self) -> None:
        """Drop references so gloo threads die before the process group (else gloo may crash or hang at exit)."""
        self.model = self.raw_model = self.optimizer = self.scheduler = None


@contextlib.contextmanager
def deepspeed_probe_skipped() -> Iterator[None]:
    """Save without importing DeepSpeed in a run that never loaded it (accelerate's unwrap imports it to probe)."""
    other = sys.modules.get("accelerate.utils.other")
    if other is None or "deepspeed" in sys.modules or not hasattr(other, "is_deepspeed_available"):
        yield
        return
    probe = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = probe
