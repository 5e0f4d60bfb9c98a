"""Pipeline parallelism for BLOOM with ``torch.distributed.pipelining`` (GPipe and 1F1B).

The model is cut into ``pp`` stages of consecutive blocks, one stage per group of ranks (its tp × dp
ranks: a stage is then tensor- and data-parallel within itself, ``ecomkit.parallel.mixed``), as many
blocks per stage as possible alike (``--parallel-pp-balance layers``) or, with ``compute``, fewer on the
last stage, which also runs the LM head (:func:`stage_layer_ranges`):

- stage 0: word embeddings + embedding LayerNorm + its blocks;
- middle stages: their blocks;
- last stage: its blocks + ``ln_f`` + LM head; the loss is computed here.

Each stage is the original ``BloomForCausalLM`` with everything it does not
own removed (torchtitan's approach: no model code is rewritten). A stage
receives ``(hidden_states, attention_mask)`` from the previous one and
rebuilds ALiBi and the causal mask from the mask (cheap, and it keeps the
activations sent between stages to the one ``[batch, T, h]`` tensor plus the
integer mask).

Schedules (``--parallel-pp-schedule``), for ``m`` micro-batches and ``p``
stages, with the bubble (idle) fraction ``(p-1)/(m+p-1)`` for both:

- **GPipe**: all forwards, then all backwards. Every stage keeps the
  activations of all ``m`` micro-batches until their backward.
- **1F1B**: after ``p - rank - 1`` warm-up forwards, alternate one forward
  and one backward. At most ``p`` micro-batches are in flight per stage, so
  activation memory no longer grows with ``m``.

**Tied embeddings.** BLOOM ties the LM head to the
word embeddings. Split across stages, the one tensor becomes two copies: the
embedding on stage 0, the head on the last stage. Each copy only sees the
gradient of its own use, so trained independently they drift apart after the
first step. Here the two gradients are **summed by an all-reduce between the
first and the last stage** after every schedule step: both copies then get the
gradient of the tied weight (the sum of both uses, exactly what autograd
computes for one shared tensor), take the same AdamW step and stay identical.
The gradient norm counts the weight once, like a single process does. In 3-D
each (dp, tp) coordinate has its own {first, last} pair; FSDP2 shards both
copies alike, so the pair sums its local shards.

**Fixed shapes.** A ``PipelineStage`` infers the shapes of what it sends and
receives from the first step and preallocates those buffers, so every step is
padded (right) to ``seq_len``: pad tokens are masked out of attention and the
loss, so the real positions' logits do not change.

**The training loop.** A pipeline interleaves the forward and backward of
different micro-batches, so it cannot be driven through the loop's per-batch
``forward_logits`` + ``backward``. :class:`PipelineRunner` runs a whole
optimizer step (:meth:`PipelineRunner.train_step`) and the strategy exposes
it as ``forward_backward(micro_batches, loss_scale)``. Evaluation uses
:meth:`PipelineRunner.forward_logits`: a plain stage-by-stage forward whose
logits are broadcast from the last stage, so the loop's evaluation code runs
unchanged (extra traffic in evaluation only).
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

    Every stage gets one block, then each further block goes to the least loaded stage (the earliest on a
    tie). ``head_blocks``: the last stage also runs the LM head, worth that many blocks
    (:func:`head_cost_in_blocks`, ``--parallel-pp-balance compute``); 0 gives the even split, earlier stages
    taking the extras (``--parallel-pp-balance layers``).
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

    Training FLOPs per token: 6 per weight, plus 12·h·T for a block's attention scores and weighted sums. The
    head's 6·V·h stays whole on every tp rank (``parallel/tensor.py`` keeps it replicated) while a block's
    work divides by tp: for BLOOM-7b1 at T = 1024 and tp = 2 the head weighs about 10 blocks.
    """
    block = 6.0 * block_params + 12.0 * hidden * seq_len
    return 6.0 * vocab * hidden * tp / block


class StageBlocks(nn.ModuleList):
    """A stage's blocks under their names in the unsplit model: the stage of blocks 3-5 holds ``h.3 … h.5``.

    Why: a parameter's name is its key in every state dict: DCP checkpoints (each stage writes its own keys
    into one checkpoint), the optimizer state, the layout report. Renumbered from 0, every stage would hold an
    ``h.0`` and their keys would collide. Indexing stays local (``blocks[0]`` is this stage's first block), as
    torchtitan's stages keep their layer names by holding them in a dict.
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
            # untie: the head becomes this stage's own copy of the embedding matrix (see module docstring)
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
        """This stage's whole tensors under their names in the unsplit model, on the CPU.

        Tensor- or data-parallel shards (DTensors) are gathered first: a collective over the stage's tp and dp
        ranks, so every rank of the stage calls it.
        """
        out = {}
        for name, tensor in self.model.state_dict().items():
            if name == "lm_head.weight" and not self.is_first:
                continue  # the tied copy: the unsplit model stores it once, as the embedding
            whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
            out[name] = whole.detach().cpu()
        return out


def pad_to_length(batch: dict[str, torch.Tensor], length: int, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad ``input_ids``/``attention_mask``/``labels`` to ``length`` (mask 0, label -100).

    A training batch that says whether it is padded (``has_padding``) says so after the padding too, so its
    mask is built the same way (4-D, ``models.attention.attention_mask_for``) whatever its own length:
    the schedule sends the mask between stages in buffers shaped at the first step.
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
        self.pp_ranks = list(pp_ranks)            # global ranks of stages 0..pp-1 of this pipeline
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

    # ------------------------------------------------------------------ training
    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        tok_sum = token_loss_sum(logits, labels)
        self._token_sums.append(tok_sum.detach())
        return tok_sum * self._scale

    def train_step(self, micro_batches: Sequence[dict[str, torch.Tensor]],
                   loss_scale: float | torch.Tensor) -> torch.Tensor:
        """Forward + backward of one optimizer step's micro-batches; returns their token-loss sum (a tensor).

        The step's micro-batches are concatenated and cut into
        ``n_microbatches`` pipeline micro-batches. Every stage returns the same
        sum (broadcast from the last stage), so the loop can reduce it over
        all ranks like any other strategy's.
        """
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
        """Sum the tied embedding/head gradients of the first and the last stage (their local shards).

        Data parallelism across replicas is FSDP2's (:func:`build_pipeline`): the schedule has already
        reduce-scattered every gradient over dp. Both copies of the tied matrix are sharded alike (same dp
        rank, same rows), so summing the local shards sums the whole gradients.
        """
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

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def forward_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits on every stage: stage by stage with send/recv, then a broadcast from the last stage.

        Used for evaluation only (every rank of the pipeline holds the same
        batch), so the batch shape may change from call to call.
        """
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
    """The schedule of this rank's stage, already cut (and tensor/data-parallel). Every rank must call it.

    ``stage_module`` is this rank's :class:`BloomPipelineStage`, parallelized within its stage by
    ``ecomkit.parallel.mixed.parallelize`` (TP over ``mesh["tp"]``, FSDP2 over ``mesh["dp"]`` with the stage
    as FSDP's root, which is what ``torch.distributed.pipelining`` looks for to delay the gradient
    reduce-scatter to the step's last micro-batch).
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

    Every rank gathers its stage's shards (:meth:`BloomPipelineStage.global_state_dict`); the ranks at
    dp = tp = 0 of each stage send them to rank 0 with ``gather_object`` (pickled CPU tensors). Fine for
    the models that train on this machine; for billions of parameters save with
    ``torch.distributed.checkpoint`` instead (``--dcp-dir``), which writes each rank's shard where it is.
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
