"""Pipeline parallelism for BLOOM with ``torch.distributed.pipelining`` (GPipe and 1F1B).

Each stage is the original ``BloomForCausalLM`` pruned to its consecutive blocks (stage 0 adds the embeddings, the last
``ln_f``, the head and the loss), so no model code is rewritten. The tied embedding and head, split over the first and
last stage, have their gradients summed by an all-reduce each step so both copies stay identical. Every step is
right-padded to ``seq_len``: a stage's send/receive buffers keep the first step's shapes.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor

from ecomkit.errors import ConfigError, EcomkitError
from ecomkit.models.attention import attention_mask_for
from ecomkit.models.loss import token_loss_sum


def stage_layer_ranges(n_layer: int, n_stages: int, head_blocks: float = 0.0) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` block ranges per stage, so that the most loaded stage is as light as possible.

    Each block after the first per stage goes to the least loaded (earliest on a tie). ``head_blocks``: the LM head's
    weight on the last stage (``--parallel-pp-balance compute``); 0 gives the even split (``layers``).
    """
    if not 1 <= n_stages <= n_layer:
        raise ConfigError(f"pp={n_stages} must be between 1 and the {n_layer} blocks of the model (--parallel-pp).")
    counts = [1] * n_stages
    load = [1.0] * (n_stages - 1) + [1.0 + head_blocks]
    for _ in range(n_layer - n_stages):
        s = min(range(n_stages), key=lambda i: (load[i], i))
        counts[s] += 1
        load[s] += 1.0
    ranges, start = [], 0
    for count in counts:
        ranges.append((start, start + count))
        start += count
    return ranges


def head_cost_in_blocks(vocab: int, hidden: int, block_params: int, tp: int, seq_len: int) -> float:
    """The LM head's FLOPs per token on one rank of the last stage, in blocks' FLOPs on one tp rank.

    6 FLOPs per weight plus 12·h·T per block for attention; the head's 6·V·h is whole on every tp rank, a block's
    divides by tp.
    """
    block = 6.0 * block_params + 12.0 * hidden * seq_len
    return 6.0 * vocab * hidden * tp / block


class StageBlocks(nn.ModuleList):
    """A stage's blocks under their names in the unsplit model: the stage of blocks 3-5 holds ``h.3 … h.5``.

    Why: names are state-dict keys (DCP, optimizer, layout); renumbered from 0 the stages' keys would collide.
    """

    def __init__(self, blocks: Sequence[nn.Module], first: int):
        super().__init__()
        self.first = first
        for i, block in enumerate(blocks):
            self.add_module(str(first + i), block)

    def _get_abs_string_index(self, idx: Any) -> str:
        return str(self.first + int(super()._get_abs_string_index(idx)))

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return nn.ModuleList(list(self._modules.values())[idx])
        return super().__getitem__(idx)


class BloomPipelineStage(nn.Module):
    """One pipeline stage of a ``BloomForCausalLM``: the original model, pruned to what this stage owns."""

    def __init__(self, model: nn.Module, stage: int, n_stages: int, head_blocks: float = 0.0):
        super().__init__()
        self.stage, self.n_stages = stage, n_stages
        self.is_first, self.is_last = stage == 0, stage == n_stages - 1
        self.layer_range = stage_layer_ranges(model.config.n_layer, n_stages, head_blocks)[stage]
        transformer = model.transformer
        lo, hi = self.layer_range
        transformer.h = StageBlocks(list(transformer.h)[lo:hi], first=lo)
        if self.is_last and not self.is_first:
            # untie: the head becomes this stage's own copy of the embedding matrix
            model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
        if not self.is_first:
            transformer.word_embeddings = None
            transformer.word_embeddings_layernorm = nn.Identity()  # applied once, on stage 0
        if not self.is_last:
            transformer.ln_f = nn.Identity()
            model.lm_head = None
        self.model = model

    def forward(self, first: torch.Tensor, attention_mask: torch.Tensor):
        """Stage 0 takes ``input_ids``, later stages the previous stage's hidden states."""
        if self.is_first:
            kwargs = {"input_ids": first}
        else:
            kwargs = {"inputs_embeds": first}
        if self.is_last:
            return self.model(attention_mask=attention_mask, use_cache=False, **kwargs).logits
        hidden = self.model.transformer(attention_mask=attention_mask, use_cache=False, **kwargs).last_hidden_state
        return hidden, attention_mask

    def tied_weight(self) -> nn.Parameter | None:
        """This stage's copy of the tied embedding/head matrix (None on middle stages)."""
        if self.is_first:
            return self.model.transformer.word_embeddings.weight
        if self.is_last:
            return self.model.lm_head.weight
        return None

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """This stage's whole tensors under their unsplit names, on the CPU (a collective over its tp and dp ranks)."""
        out = {}
        for name, tensor in self.model.state_dict().items():
            if name == "lm_head.weight" and not self.is_first:
                continue  # the tied copy: the unsplit model stores it once, as the embedding
            whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            out[name] = whole.detach().cpu()
        return out


def pad_to_length(batch: dict[str, torch.Tensor], length: int, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad ``input_ids``/``attention_mask``/``labels`` to ``length`` (mask 0, label -100).

    ``has_padding`` stays set so the mask is built the same way every step: stages send it in first-step-shaped buffers.
    """
    t = batch["input_ids"].shape[1]
    if t > length:
        raise ConfigError(f"a batch has {t} tokens but the pipeline was built for --seq-len {length}.")
    if t == length:
        return batch
    pad = length - t
    fill = {"input_ids": pad_id, "attention_mask": 0, "labels": -100, "document_ids": 0}
    out = {k: torch.nn.functional.pad(batch[k], (0, pad), value=fill[k]) for k in fill if k in batch}
    if "has_padding" in batch:
        out["has_padding"] = True
    return out


class PipelineRunner:
    """The schedule, the stage and the groups of one pipeline rank; runs whole optimizer steps."""

    def __init__(self, stage_module: BloomPipelineStage, *, pp_rank: int, pp_size: int, pp_group: Any,
                 pp_ranks: Sequence[int], tied_group: Any | None, device: torch.device,
                 n_microbatches: int, schedule: str, seq_len: int, pad_id: int = 0):
        self.module = stage_module
        self.pp_rank, self.pp_size, self.pp_group = pp_rank, pp_size, pp_group
        self.pp_ranks = list(pp_ranks)
        self.tied_group = tied_group
        self.device, self.seq_len, self.pad_id = device, seq_len, pad_id
        self.n_microbatches = n_microbatches
        self._scale = 1.0
        self._token_sums: list[torch.Tensor] = []
        self.stage = PipelineStage(stage_module, stage_index=pp_rank, num_stages=pp_size, device=device,
                                   group=pp_group)
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        # scale_grads=False: the loss is already normalised for the global batch (the loop's convention)
        self.schedule = cls(self.stage, n_microbatches=n_microbatches, loss_fn=self._loss, scale_grads=False)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        tok_sum = token_loss_sum(logits, labels)
        self._token_sums.append(tok_sum.detach())
        return tok_sum * self._scale

    def train_step(self, micro_batches: Sequence[dict[str, torch.Tensor]],
                   loss_scale: float | torch.Tensor) -> torch.Tensor:
        """One optimizer step's forward + backward; the token-loss sum, broadcast from the last stage to every stage."""
        padded = [pad_to_length(b, self.seq_len, self.pad_id) for b in micro_batches]
        ids = torch.cat([b["input_ids"] for b in padded]).to(self.device)
        # packed rows: each stage gets the document mask (models/attention.py) in place of the padding mask
        mask = torch.cat([attention_mask_for(b) for b in padded]).to(self.device)
        self._check_mask_layout(mask)
        labels = torch.cat([b["labels"] for b in padded]).to(self.device)
        if ids.shape[0] % self.n_microbatches:
            raise ConfigError(
                f"Pipeline parallelism cuts each optimizer step's {ids.shape[0]} samples (--micro-batch-size × "
                f"--grad-accum) into {self.n_microbatches} pipeline micro-batches (--parallel-pp-microbatches), "
                "which must divide it. Change one of the three.")
        self._scale, self._token_sums = loss_scale, []
        is_first, is_last = self.module.is_first, self.module.is_last
        target = labels if is_last else None
        if is_first:
            self.schedule.step(ids, mask, target=target, losses=[] if is_last else None)
        else:
            self.schedule.step(target=target, losses=[] if is_last else None)
        # the first step also runs the loss once on placeholder tensors (shape inference): keep the real ones
        real = self._token_sums[-self.n_microbatches:]
        total = torch.stack(real).sum() if is_last else torch.zeros((), device=self.device)
        total = total.to(torch.float64)
        dist.broadcast(total, src=self.pp_ranks[-1], group=self.pp_group)
        self.sync_gradients()
        return total

    def _check_mask_layout(self, mask: torch.Tensor) -> None:
        """The mask every step sends must have the first step's shape and dtype (the stages' receive buffers)."""
        layout = (tuple(mask.shape), mask.dtype)
        first = self.__dict__.setdefault("_mask_layout", layout)
        if layout != first:
            raise EcomkitError(f"pipeline step mask {layout} differs from the first step's {first}: the next stage "
                               "would read it into a buffer of the first shape. This is a bug in ecomkit; please "
                               "report it with the command line.")

    def sync_gradients(self) -> None:
        """Sum the tied embedding/head gradients' local shards of the first and last stage (sharded alike by FSDP2)."""
        tied = self.module.tied_weight()
        if self.tied_group is None or tied is None:
            return
        if tied.grad is None:
            tied.grad = torch.zeros_like(tied)
        grad = tied.grad.to_local() if isinstance(tied.grad, DTensor) else tied.grad
        dist.all_reduce(grad, group=self.tied_group)

    def grad_norm_sq_parameters(self) -> list[nn.Parameter]:
        """Parameters whose gradients enter the norm: the tied matrix counted once (on stage 0)."""
        tied = self.module.tied_weight()
        skip = tied if (self.module.is_last and not self.module.is_first) else None
        return [p for p in self.module.parameters() if p.grad is not None and p is not skip]

    @torch.no_grad()
    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits on every stage for evaluation: stage by stage with send/recv, then a broadcast from the last stage."""
        b, t = input_ids.shape
        hidden_size = self.module.model.config.hidden_size
        vocab = self.module.model.config.vocab_size
        prev = self.pp_ranks[self.pp_rank - 1] if self.pp_rank > 0 else None
        nxt = self.pp_ranks[self.pp_rank + 1] if self.pp_rank < self.pp_size - 1 else None
        if self.module.is_first:
            first = input_ids
        else:
            first = torch.empty(b, t, hidden_size, dtype=torch.float32, device=self.device)
            dist.recv(first, src=prev)
        out = self.module(first, attention_mask)
        if not self.module.is_last:
            dist.send(out[0].float().contiguous(), dst=nxt)
            logits = torch.empty(b, t, vocab, dtype=torch.float32, device=self.device)
        else:
            logits = out.float().contiguous()
        dist.broadcast(logits, src=self.pp_ranks[-1], group=self.pp_group)
        return logits


def build_pipeline(stage_module: BloomPipelineStage, *, mesh: Any, dims: Any, device: torch.device,
                   n_microbatches: int, schedule: str, seq_len: int, pad_id: int = 0) -> PipelineRunner:
    """The schedule of this rank's stage, already cut and parallelized (``mixed.parallelize``); every rank calls it.

    The stage is FSDP's root, which is what ``torch.distributed.pipelining`` needs to delay the reduce-scatter.
    """
    pp_mesh = mesh["pp"]
    pp_rank, pp_size = pp_mesh.get_local_rank(), pp_mesh.size()
    coords = dims.coordinates(dist.get_rank())
    pp_ranks = [dims.rank_of(s, coords["dp"], coords["tp"]) for s in range(pp_size)]
    tied_group = _tied_embedding_group(dims) if pp_size > 1 else None
    return PipelineRunner(stage_module, pp_rank=pp_rank, pp_size=pp_size, pp_group=pp_mesh.get_group(),
                          pp_ranks=pp_ranks, tied_group=tied_group, device=device,
                          n_microbatches=n_microbatches, schedule=schedule, seq_len=seq_len, pad_id=pad_id)


def _tied_embedding_group(dims: Any) -> Any:
    """The {first stage, last stage} group of this rank's pipeline; every rank creates all of them in order."""
    mine = None
    rank = dist.get_rank()
    for dp in range(dims.dp):
        for tp in range(dims.tp):
            ranks = [dims.rank_of(0, dp, tp), dims.rank_of(dims.pp - 1, dp, tp)]
            group = dist.new_group(ranks=ranks)
            if rank in ranks:
                mine = group
    return mine


def gather_pipeline_state_dict(runner: PipelineRunner, dims: Any) -> dict[str, torch.Tensor] | None:
    """The full model's state dict on global rank 0, None elsewhere; a collective on every rank.

    Pickled CPU tensors via ``gather_object``: fine for small models; large ones save with ``--dcp-dir``.
    """
    coords = dims.coordinates(dist.get_rank())
    stage = runner.module.global_state_dict()
    mine = stage if coords["dp"] == 0 and coords["tp"] == 0 else None
    parts: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, parts, dst=0)
    if dist.get_rank() != 0:
        return None
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part or {})
    return merged
