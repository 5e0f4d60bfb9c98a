"""Mixed parallelism (chapter 04): FSDP2, tensor parallel, pipeline parallel and their 2-D and 3-D meshes.

One strategy serves ``--strategy fsdp | tp | pp | mixed`` with the degrees of
:class:`~ecomkit.parallel.dims.ParallelDims`, in torchtitan's order: the pipeline cuts first, then :func:`parallelize`
applies TP, activation checkpointing and FSDP2. Data is sharded over the dp replicas only (the tp × pp ranks of a
replica see one batch), and parameters keep their unsplit names, so any layout's DCP checkpoint is one checkpoint.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, ContextManager, Sequence

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.tensor import DTensor

from ecomkit.config import TrainConfig
from ecomkit.dist import DistEnv, gather_objects
from ecomkit.errors import EcomkitError
from ecomkit.models.bloom import ModelSource, build_empty_model, build_model
from ecomkit.models.checkpoint_files import CheckpointReader
from ecomkit.models.optim import build_optimizer, build_scheduler
from ecomkit.parallel.base import StepStats, Strategy, deepspeed_probe_skipped
from ecomkit.parallel.comm_count import CollectiveCounter
from ecomkit.parallel.dims import ParallelDims
from ecomkit.parallel.fsdp import apply_fsdp, load_local_parts, set_gradient_sync
from ecomkit.parallel.grad_norm import clip_gradients_, total_grad_norm
from ecomkit.parallel.pipeline import (BloomPipelineStage, build_pipeline, gather_pipeline_state_dict,
                                      head_cost_in_blocks)
from ecomkit.parallel.tensor import apply_tensor_parallel, bloom_blocks

LAYOUT_FILE = "parallel_layout.json"
_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."


def apply_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Wrap every BLOOM block in a non-reentrant checkpoint wrapper (in place): a module FSDP2 shards as one unit."""
    blocks = bloom_blocks(model)
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    return model


def parallelize(model: nn.Module, dims: ParallelDims, cfg: TrainConfig, mesh: Any,
                device: torch.device | None = None, fsdp_root: nn.Module | None = None) -> nn.Module:
    """Apply TP → activation checkpointing → FSDP2 to ``model`` in place, as ``dims`` asks; returns it.

    ``mesh``: the (pp, dp, tp) DeviceMesh (unused dimensions of size 1). With a pipeline, ``model`` is one stage's
    pruned model and ``fsdp_root`` the stage wrapping it, so FSDP's root is the module the schedule runs.
    """
    par = cfg.parallel
    # 0. The pipeline has already cut the model (outermost): what follows parallelizes one stage.
    # 1. TP first: FSDP2 then shards its tp DTensors to 2-D (dp × tp); the other way, TP would find FSDP's shards.
    if dims.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=par.sequence_parallel)
    # 2. Checkpointing around each TP block, inside FSDP: the recompute replays TP's collectives, FSDP gathers once.
    if par.activation_checkpointing:
        apply_activation_checkpointing(model)
    # 3. FSDP2 last, one unit per block, then the root; the replicas shard in every layout (what the planner counts).
    if dims.dp > 1:
        apply_fsdp(model, mesh["dp"], precision=cfg.precision, reshard_after_forward=par.reshard_after_forward,
                   cpu_offload=par.fsdp_cpu_offload, device=device, root=fsdp_root)
    return model


def parameter_layout(model: nn.Module) -> list[dict[str, Any]]:
    """One row per parameter this rank holds: name in the unsplit model, global and local shape, placements, bytes."""
    rows = []
    for name, p in model.named_parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        name = name.replace(_CHECKPOINT_PREFIX, "")  # activation checkpointing's wrapper module
        rows.append({
            "name": name,
            "global_shape": list(p.shape),
            "local_shape": list(local.shape),
            "placements": [str(x) for x in p.placements] if isinstance(p, DTensor) else ["plain"],
            "mesh_dims": list(p.device_mesh.mesh_dim_names or ()) if isinstance(p, DTensor) else [],
            "local_bytes": local.numel() * local.element_size(),
        })
    return rows


class MixedParallelStrategy(Strategy):
    """FSDP2 / TP / PP / (TP or PP) × FSDP, with per-step collective counts in the metrics."""

    replicated = False
    has_ddp_hooks = False

    def __init__(self, cfg: TrainConfig, env: DistEnv):
        super().__init__(cfg, env)
        self.dims = ParallelDims.from_config(cfg, env.world_size)  # checked by TrainConfig.validate
        self.coords = self.dims.coordinates(env.rank)
        self.name = cfg.strategy
        self.mesh: Any = None
        self.pipeline: Any = None
        self.counter = CollectiveCounter() if cfg.parallel.count_collectives else None
        self._layout_written = False
        self._checkpoint: CheckpointReader | None = None  # set by build_model when setup must load the weights

    def data_shard(self) -> tuple[int, int]:
        """(shard index, number of shards) for the data: the dp coordinate, not the global rank."""
        return self.coords["dp"], self.dims.dp

    @property
    def supports_chunked_loss(self) -> bool:
        """FSDP2 alone: TP shards the head's output over ranks and a pipeline's last stage owns the loss."""
        return self.dims.tp == 1 and self.dims.pp == 1

    @property
    def owns_forward_backward(self) -> bool:
        """True with a pipeline: the loop must call :meth:`forward_backward` once per optimizer step."""
        return self.pipeline is not None

    def build_model(self, source: ModelSource) -> nn.Module:
        """A local checkpoint sharded by FSDP2/TP starts on the meta device; :meth:`setup` loads each rank's part.

        A pipeline (cut first) and a preset (seeded random init) are built whole on every rank.
        """
        if self.dims.pp == 1 and self.dims.dp * self.dims.tp > 1 and source.is_local_checkpoint:
            self._checkpoint = CheckpointReader(source.name_or_path)
            return build_empty_model(self.in_weight_dtype(source), device="meta")
        return super().build_model(source)

    def setup(self, model: nn.Module, total_steps: int) -> None:
        self.raw_model = model
        self.model_config = model.config
        if self.env.distributed:
            self.mesh = self.dims.build_mesh(self.env.device.type)
        if self.dims.pp > 1:
            self.model = self._build_pipeline(model)
        else:
            self.model = parallelize(model, self.dims, self.cfg, self.mesh, self.env.device)
            if self._checkpoint is not None:  # built on meta: only now allocate and read
                load_local_parts(self.model, self._checkpoint, self.env.device)
                self._checkpoint = None
        self.optimizer = build_optimizer(self.model, self.cfg)
        if self.pipeline is not None:
            self._follow_tied_weight_decay()
        self.scheduler = build_scheduler(self.optimizer, self.cfg, total_steps)
        self.scaler = None  # fp16 is refused by TrainConfig.validate for these strategies

    def _build_pipeline(self, model: nn.Module) -> nn.Module:
        """Cut this rank's stage (pp outermost), parallelize it over its (dp, tp) ranks, build its schedule."""
        stage = BloomPipelineStage(model, self.coords["pp"], self.dims.pp, self._head_blocks(model))
        parallelize(model, self.dims, self.cfg, self.mesh, self.env.device, fsdp_root=stage)
        self.pipeline = build_pipeline(
            stage, mesh=self.mesh, dims=self.dims, device=self.env.device,
            n_microbatches=self.cfg.parallel.pp_microbatches, schedule=self.cfg.parallel.pp_schedule,
            seq_len=self.cfg.seq_len, pad_id=model.config.pad_token_id or 0)
        return stage

    def _head_blocks(self, model: nn.Module) -> float:
        """The LM head's weight in blocks for ``--parallel-pp-balance compute`` (0: stages by block count)."""
        if self.cfg.parallel.pp_balance != "compute":
            return 0.0
        block_params = sum(p.numel() for p in bloom_blocks(model)[0].parameters())
        return head_cost_in_blocks(model.config.vocab_size, model.config.hidden_size, block_params, self.dims.tp,
                                   int(self.cfg.seq_len))

    def _follow_tied_weight_decay(self) -> None:
        """The last stage's head copy follows the tied embedding's no-decay rule (it is named lm_head here)."""
        tied = self.pipeline.module.tied_weight()
        if tied is None or not self.pipeline.module.is_last or self.pipeline.module.is_first:
            return
        decay = [g for g in self.optimizer.param_groups if g["weight_decay"] > 0]
        no_decay = [g for g in self.optimizer.param_groups if g["weight_decay"] == 0]
        for group in decay:
            if any(p is tied for p in group["params"]):
                group["params"] = [p for p in group["params"] if p is not tied]
                no_decay[0]["params"].append(tied)

    def _counting(self) -> ContextManager:
        return self.counter if self.counter is not None else contextlib.nullcontext()

    def micro_step_context(self, is_last: bool) -> ContextManager:
        stack = contextlib.ExitStack()
        if self.dims.dp > 1 and self.pipeline is None:
            set_gradient_sync(self.model, is_last)
        stack.enter_context(self._counting())
        return stack

    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of one batch; ``positions`` are selected after the head (TP and PP gather whole sequences)."""
        logits = self._all_logits(input_ids, attention_mask)
        return logits if positions is None else logits[:, positions]

    def _all_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if self.pipeline is not None:
            if torch.is_grad_enabled() and self.model.training:
                raise EcomkitError(_NEEDS_LOOP_HOOK)
            with self.autocast():
                return self.pipeline.forward_logits(input_ids, attention_mask)
        t = input_ids.shape[1]
        multiple = self.dims.tp if self.cfg.parallel.sequence_parallel else 1
        pad = (-t) % multiple
        if pad:  # sequence parallel cuts T into tp equal pieces; right padding leaves real positions unchanged
            input_ids = torch.nn.functional.pad(input_ids, (0, pad), value=self.model_config.pad_token_id or 0)
            attention_mask = (torch.nn.functional.pad(attention_mask, (0, pad), value=0) if attention_mask.dim() == 2
                              else torch.nn.functional.pad(attention_mask, (0, pad, 0, pad),   # a document mask
                                                           value=torch.finfo(attention_mask.dtype).min))
        with self.autocast():
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits[:, :t] if pad else logits

    def forward_backward(self, micro_batches: Sequence[dict[str, torch.Tensor]],
                         loss_scale: float | torch.Tensor) -> torch.Tensor:
        """Pipeline only: the whole step through the GPipe/1F1B schedule; returns the token-loss sum (a tensor)."""
        if self.pipeline is None:
            raise EcomkitError("forward_backward is the pipeline-parallel step; this run has pp=1.")
        with self._counting(), self.autocast():
            return self.pipeline.train_step(micro_batches, loss_scale)

    def clip_and_step(self, max_norm: float) -> StepStats:
        with self._counting():
            if self.pipeline is not None:
                params = self.pipeline.grad_norm_sq_parameters()
                norm = total_grad_norm([p.grad for p in params], self.pipeline.pp_group)
                grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            else:
                grads = [p.grad for p in self.model.parameters() if p.grad is not None]
                norm = total_grad_norm(grads)
            clip_gradients_(grads, max_norm, norm)
            self.optimizer.step()
        if not self._layout_written:
            self._write_layout()   # after the first step: optimizer states exist, gradients not yet freed
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        extra: dict[str, Any] = {}
        if self.counter is not None:
            extra.update(self.counter.pop_stats().as_dict())
        return StepStats(grad_norm=norm, extra=extra)

    def _write_layout(self) -> None:
        """Which tensor lives where: every rank's parameters (shapes, placements) and state bytes → one JSON."""
        self._layout_written = True
        mine = {"rank": self.env.rank, "coords": self.coords, "memory": self.memory_report(),
                "params": parameter_layout(self.raw_model)}
        parts = gather_objects(mine, self.env)
        if self.env.is_main:
            out = Path(self.cfg.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            report = {"strategy": self.cfg.strategy, "dims": {"dp": self.dims.dp, "tp": self.dims.tp,
                      "pp": self.dims.pp, "world_size": self.dims.world_size},
                      "sequence_parallel": self.cfg.parallel.sequence_parallel, "ranks": parts}
            (out / LAYOUT_FILE).write_text(json.dumps(report, indent=1))

    def save_pretrained(self, out_dir: str, tokenizer: Any | None = None) -> None:
        """Gather the full weights (all ranks take part), then rank 0 writes a plain HF directory."""
        full = self.full_state_dict()
        if not self.env.is_main:
            return
        model = build_model(self.model_config, seed=None)
        missing, unexpected = model.load_state_dict(full, strict=False)
        missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embedding
        if missing or unexpected:
            raise EcomkitError(f"Consolidating the parallel model failed: missing {missing}, unexpected {unexpected}.")
        with deepspeed_probe_skipped():   # an FSDP/TP/PP run never loads DeepSpeed: no probe, no warning
            model.save_pretrained(out_dir)
        if tokenizer is not None:
            tokenizer.save_pretrained(out_dir)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsplit model's state dict on rank 0 (empty elsewhere); a collective on every rank."""
        if self.pipeline is not None:
            return gather_pipeline_state_dict(self.pipeline, self.dims) or {}
        if not self.env.distributed:
            return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def close(self) -> None:
        self.pipeline = None
        self.counter = None
        super().close()


_NEEDS_LOOP_HOOK = (
    "Pipeline parallelism runs a whole optimizer step through its GPipe/1F1B schedule, but this training loop "
    "called forward_logits() for training, one micro-batch at a time. A training loop must call "
    "strategy.forward_backward(micro_batches, loss_scale) when strategy.owns_forward_backward is True, as "
    "ecomkit.train.loop does.")


def save_sharded_model(model: nn.Module, path: str | Path) -> None:
    """Every rank writes its own shards with ``torch.distributed.checkpoint`` (no gather to one rank)."""
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(path))


def load_sharded_model(model: nn.Module, path: str | Path) -> nn.Module:
    """Load a DCP checkpoint into ``model`` on every rank, whatever world size or layout wrote it."""
    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"])
    return model


class SaveShardedModel:
    """Callback: at the end of training every rank writes its shards with DCP into ``cfg.parallel.dcp_dir``.

    The unwrapped model keeps the unsplit model's names on every layout, so the shards form one checkpoint.
    """

    def __init__(self, path: str):
        self.path = path

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        save_sharded_model(run.strategy.raw_model, self.path)


def sharded_model_callbacks(cfg: TrainConfig) -> list[SaveShardedModel]:
    """The DCP-save callback when ``cfg.parallel.dcp_dir`` is set (chapter 04's ``--dcp-dir``), else nothing."""
    return [SaveShardedModel(cfg.parallel.dcp_dir)] if cfg.parallel.dcp_dir else []
