"""DeepSpeed ZeRO stages 0-3 (with CPU offload) as a strategy of chapter 02's loop (chapter 03).

Stage 1 partitions the optimizer states over the N ranks, 2 also the gradients, 3 also the parameters. The engine counts
micro-steps itself, so :meth:`ZeroStrategy.backward` calls ``engine.step()`` after each non-final micro-batch and
:meth:`~ZeroStrategy.clip_and_step` makes the boundary call; ``scale_wrt_gas=False`` keeps DDP's gradients. DeepSpeed is
imported lazily, right after :func:`~ecomkit.parallel.zero.env.ensure_deepspeed_env`.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from dataclasses import replace
from typing import Any, ContextManager, Iterator

import torch
import torch.distributed as dist
from torch import nn

from ecomkit.config import TrainConfig
from ecomkit.config.recipe import mechanics_value
from ecomkit.dist import DistEnv, log
from ecomkit.errors import ConfigError, EcomkitError
from ecomkit.models.bloom import ModelSource, build_empty_model, count_parameters, enable_activation_checkpointing
from ecomkit.models.optim import build_optimizer, build_scheduler, param_groups
from ecomkit.hardware import DTYPES
from ecomkit.parallel.base import StepStats, Strategy
from ecomkit.parallel.zero.checkpoint import consolidated_save_pretrained
from ecomkit.parallel.zero.config import build_zero_config, save_zero_config
from ecomkit.parallel.zero.env import (build_error_summary, ensure_deepspeed_env, ensure_process_group,
                                      quiet_deprecations)
from ecomkit.parallel.zero.load import build_partitioned, partitioned_parameter_count
from ecomkit.parallel.zero.state import zero_state_bytes


class CPUAdamUnavailableWarning(UserWarning):
    """Offload was requested but DeepSpeedCPUAdam could not be built; torch AdamW runs instead."""


def _cpu_adam_or_none(groups: list[dict], cfg: TrainConfig) -> tuple[torch.optim.Optimizer | None, str]:
    """Try DeepSpeedCPUAdam (JIT-built C++ op); return (optimizer or None, reason it failed)."""
    try:
        ensure_deepspeed_env()
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # lazy: heavy optional dependency (and a JIT build)

        return DeepSpeedCPUAdam(groups, lr=mechanics_value("lr", cfg.lr), betas=(cfg.beta1, cfg.beta2), eps=1e-8,
                                weight_decay=cfg.weight_decay, adamw_mode=True), ""
    except Exception as exc:  # a compiler missing, a failed build, an unsupported CPU: all mean "cannot use it"
        return None, build_error_summary(exc)


def _all_ranks_agree(ok: bool, env: DistEnv) -> bool:
    """True only if ``ok`` on every rank: all ranks must pick the same optimizer or ZeRO's collectives hang."""
    if not env.distributed:
        return ok
    flag = torch.tensor([1 if ok else 0], device=env.device if env.backend == "nccl" else "cpu")
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def build_zero_optimizer(model: nn.Module, cfg: TrainConfig, env: DistEnv) -> torch.optim.Optimizer:
    """torch AdamW, as :func:`~ecomkit.models.optim.build_optimizer`; with offload DeepSpeedCPUAdam when it builds."""
    if not cfg.zero.offload_optimizer:
        return build_optimizer(model, cfg)
    cpu_adam, why = _cpu_adam_or_none(param_groups(model, cfg.weight_decay), cfg)
    if _all_ranks_agree(cpu_adam is not None, env):
        return cpu_adam
    if env.is_main:
        warnings.warn(
            "ZeRO optimizer offload was requested but DeepSpeedCPUAdam is unavailable on at least one rank "
            f"({why or 'it built on this rank but not on another'}). Falling back to torch.optim.AdamW on the "
            "offloaded fp32 partitions: same results, slower optimizer step. To get CPU Adam, install a C++ "
            "compiler (g++) and the Python headers, and set TORCH_EXTENSIONS_DIR to a writable cache folder.",
            CPUAdamUnavailableWarning, stacklevel=2)
    del cpu_adam
    return build_optimizer(model, cfg)


def _check_precision_supported(precision: str) -> None:
    """DeepSpeed's CPU accelerator has no fp16 engine; say so before start-up instead of a ValueError inside it."""
    ensure_deepspeed_env()
    from deepspeed.accelerator import get_accelerator  # lazy: heavy optional dependency

    acc = get_accelerator()
    ok = {"fp16": acc.is_fp16_supported, "bf16": acc.is_bf16_supported}.get(precision, lambda: True)()
    if not ok:
        raise ConfigError(
            f"--precision {precision} is not supported by DeepSpeed's '{acc.device_name()}' accelerator on this "
            f"machine. On CPU use --precision bf16 (the same 2-byte weights and gradients, and no loss scaling "
            "needed) or fp32; fp16 with loss scaling needs a GPU.")


class ZeroStrategy(Strategy):
    """DeepSpeed engine behind ecomkit's loop: ZeRO stage 0-3, optional CPU offload of optimizer / params."""

    name = "zero"
    supports_chunked_loss = True     # stages 1-2 hold the whole head; ZeRO-3 gathers it once for the loss (lm_head())

    def __init__(self, cfg: TrainConfig, env: DistEnv):
        super().__init__(cfg, env)
        # No replica checksum: stage 3 ranks hold partitions, and numpy has no bfloat16.
        self.replicated = cfg.zero.stage < 3
        self.engine: Any = None
        self.ds_config: dict[str, Any] = {}
        self._is_last_micro_step = True

    def build_model(self, source: ModelSource) -> nn.Module:
        """ZeRO-3 on a local checkpoint: built under ``deepspeed.zero.Init``, each rank loads only its partition.

        Stages 0-2 and presets (which must match a 1-process run bit for bit) are built whole, as the base strategy
        does.
        """
        if self.cfg.zero.stage != 3 or not source.is_local_checkpoint:
            return super().build_model(source)
        source = self.in_weight_dtype(source)
        quiet_deprecations()
        _check_precision_supported(self.cfg.precision)
        ensure_process_group(self.env)
        self._make_ds_config(count_parameters(build_empty_model(source, device="meta")))
        return build_partitioned(source, self.ds_config)

    def weight_dtype(self) -> torch.dtype:
        """DeepSpeed holds the module's weights in the training dtype (fp32 masters in the optimizer): load into it."""
        return DTYPES[self.cfg.precision]

    def parameter_count(self, model: nn.Module) -> int:
        return partitioned_parameter_count(model)

    def _make_ds_config(self, n_params: int) -> None:
        grad_accum = self.cfg.resolve_grad_accum(self.env.world_size)
        self.ds_config = build_zero_config(self.cfg, self.env.world_size, grad_accum, n_params=n_params)

    def setup(self, model: nn.Module, total_steps: int) -> None:
        ensure_deepspeed_env()
        import deepspeed  # lazy: heavy optional dependency

        quiet_deprecations()
        _check_precision_supported(self.cfg.precision)
        ensure_process_group(self.env)
        if not self.ds_config:  # build_model made it already when the model was built under zero.Init
            self._make_ds_config(partitioned_parameter_count(model))
        if self.env.is_main:
            path = save_zero_config(self.ds_config, self.cfg.output_dir)
            log.info("DeepSpeed config (ZeRO-%d) written to %s", self.cfg.zero.stage, path)
        if self.cfg.zero.activation_checkpointing:
            self._enable_activation_checkpointing(model)
        self.raw_model = model
        optimizer = build_zero_optimizer(model, self.cfg, self.env)
        scheduler = build_scheduler(optimizer, self.cfg, total_steps)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.ds_config)
        if self.engine.dp_world_size != self.env.world_size:
            # DeepSpeed reads its data-parallel group from a module global; a stale one would shard wrongly
            raise EcomkitError(
                f"DeepSpeed's engine spans {self.engine.dp_world_size} data-parallel rank(s), the job "
                f"{self.env.world_size}: deepspeed.utils.groups.mpu still holds a group from an earlier engine "
                "in this process. Build probe engines with ecomkit.parallel.zero.probe.one_rank_engine, which "
                "puts it back.")
        self.model = self.engine
        if self.cfg.zero.stage == 3 and self.token_loss.kernel == "chunked":   # the head gathered once (lm_head())
            self.token_loss = replace(self.token_loss, grads_in_forward=True)

    def _enable_activation_checkpointing(self, model: nn.Module) -> None:
        """Recompute each BLOOM block in backward with DeepSpeed's checkpoint function (configured from ds_config)."""
        ensure_deepspeed_env()
        import deepspeed  # lazy: heavy optional dependency

        deepspeed.checkpointing.configure(None, deepspeed_config=self.ds_config)
        enable_activation_checkpointing(model)
        model._set_gradient_checkpointing(enable=True,
                                          gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)

    def autocast(self) -> ContextManager:
        # DeepSpeed casts the module to bf16/fp16 itself and keeps fp32 masters in the optimizer
        return contextlib.nullcontext()

    def lm_head(self) -> ContextManager[nn.Module]:
        """The head for the loss; under ZeRO-3 its weight gathered once, for the loss's forward.

        Why once: the chunked loss calls the head per chunk, a number that differs between ranks, so per-call gathers
        would disagree; the loss computes its gradients in forward instead (``TokenLoss.grads_in_forward``).
        """
        head = self.raw_model.lm_head
        if self.cfg.zero.stage < 3 or self.token_loss.from_logits:
            return contextlib.nullcontext(head)
        return _gathered(head)

    def micro_step_context(self, is_last: bool) -> ContextManager:
        self._is_last_micro_step = is_last
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        engine = self.engine
        if engine.is_gradient_accumulation_boundary() != self._is_last_micro_step:
            raise EcomkitError(
                f"DeepSpeed's micro-step counter ({engine.micro_steps}) disagrees with the loop about the "
                f"accumulation boundary (gradient_accumulation_steps={engine.gradient_accumulation_steps()}). "
                "Was the engine stepped outside ZeroStrategy? That would reduce gradients at the wrong time.")
        engine.backward(loss, scale_wrt_gas=False)
        if not self._is_last_micro_step:
            engine.step()  # not a boundary: only advances DeepSpeed's micro-step counter

    def clip_and_step(self, max_norm: float) -> StepStats:
        self._set_clip(max_norm)
        own_norm = self._stage0_grad_norm()
        self.engine.step()  # the boundary: reduce (stage 0/1), clip, optimizer step, lr scheduler step
        norm = self.engine.get_global_grad_norm()
        norm = float(norm) if norm is not None else own_norm
        return StepStats(grad_norm=norm, skipped=not self.engine.was_step_applied())

    def _stage0_grad_norm(self) -> float:
        """Stage 0 in fp32 keeps no norm: measure the (already all-reduced) module grads.

        Accumulated in float64 like DeepSpeed's own norm: torch's fp32 CPU norm is off by ~3e-5 on large gradients.
        """
        if self.cfg.zero.stage != 0:
            return float("nan")
        squares = [float(torch.linalg.vector_norm(p.grad, dtype=torch.float64)) ** 2
                   for p in self.raw_model.parameters() if p.grad is not None]
        return sum(squares) ** 0.5 if squares else float("nan")

    def _set_clip(self, max_norm: float) -> None:
        """Per-step clip value (the sentiment policy changes it): the engine and ZeRO optimizer read it at step()."""
        value = float(max_norm) if max_norm > 0 else 0.0
        self.engine._config.gradient_clipping = value
        if hasattr(self.optimizer, "clip_grad"):
            self.optimizer.clip_grad = value

    def current_lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def save_checkpoint(self, ckpt_dir: str, tag: str, client_state: dict[str, Any]) -> None:
        """Sharded: every rank writes its own optimizer/parameter partition (a collective)."""
        self.engine.save_checkpoint(ckpt_dir, tag=tag, client_state=client_state)

    def load_checkpoint(self, ckpt_dir: str, tag: str | None = None) -> dict[str, Any]:
        """Restore weights, optimizer partitions and lr scheduler; return the client state saved with them."""
        path, client_state = self.engine.load_checkpoint(ckpt_dir, tag=tag, load_optimizer_states=True,
                                                         load_lr_scheduler_states=True)
        if path is None:
            raise EcomkitError(f"No DeepSpeed checkpoint found in {ckpt_dir} (tag {tag or 'from the latest file'}). "
                               "Pass the directory a run wrote with --zero-checkpoint-interval.")
        return client_state or {}

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """fp32 weights from the optimizer's masters (a collective); the dict on rank 0, None elsewhere."""
        ensure_deepspeed_env()
        from deepspeed.utils import safe_get_full_fp32_param  # lazy: heavy optional dependency

        out: dict[str, torch.Tensor] = {}
        for name, p in self.raw_model.named_parameters():
            if not p.requires_grad:  # a frozen LoRA base has no fp32 master: its module weight is the value
                out.update(_gathered_frozen(name, p, self.env.is_main))
                continue
            full = safe_get_full_fp32_param(p)
            if full is None:  # stage 0 without bf16/fp16: the module parameter is the master
                full = p.detach()
            if self.env.is_main:
                out[name] = full.detach().float().cpu().clone()
        if not self.env.is_main:
            return None
        for name, buf in self.raw_model.named_buffers():
            out.setdefault(name, buf.detach().cpu().clone())
        return out

    def save_pretrained(self, out_dir: str, tokenizer: Any | None = None) -> None:
        """One consolidated HF directory (safetensors) that loads without DeepSpeed."""
        state = self.full_state_dict()
        if self.env.is_main:
            consolidated_save_pretrained(self.raw_model.config, state, out_dir)
            if tokenizer is not None:
                tokenizer.save_pretrained(out_dir)
        if self.env.distributed:
            dist.barrier()

    def memory_report(self) -> dict[str, Any]:
        return zero_state_bytes(self.engine)

    def close(self) -> None:
        if self.engine is not None:
            with contextlib.suppress(Exception):
                self.engine.destroy()  # removes ZeRO-3 hooks that keep references alive
        self.engine = None
        super().close()
        gc.collect()


@contextlib.contextmanager
def _gathered(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` with its partitioned parameters gathered (those already whole, like a tied embedding, left as is)."""
    ensure_deepspeed_env()
    import deepspeed  # lazy: heavy optional dependency
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus  # lazy: as above

    params = [p for p in module.parameters() if hasattr(p, "ds_status") and p.ds_status != ZeroParamStatus.AVAILABLE]
    with deepspeed.zero.GatheredParameters(params) if params else contextlib.nullcontext():
        yield module


def _gathered_frozen(name: str, p: nn.Parameter, is_main: bool) -> dict[str, torch.Tensor]:
    """A frozen parameter whole on rank 0: gathered from its ZeRO-3 partitions (a collective), else as it is."""
    ensure_deepspeed_env()
    import deepspeed  # lazy: heavy optional dependency

    ctx = deepspeed.zero.GatheredParameters([p]) if hasattr(p, "ds_id") else contextlib.nullcontext()
    with ctx:
        return {name: p.detach().float().cpu().clone()} if is_main else {}


__all__ = ["ZeroStrategy", "build_zero_optimizer", "CPUAdamUnavailableWarning"]
