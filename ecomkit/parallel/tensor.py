"""Tensor parallelism for BLOOM blocks (Megatron-style), with ``parallelize_module`` on a DeviceMesh.

Per block: QKV and ``dense_h_to_4h`` column-parallel, ``self_attention.dense`` and ``dense_4h_to_h`` row-parallel
(two activation all-reduces forward, two backward). BLOOM lays QKV out ``[heads, 3, head_dim]``, so a contiguous
column shard holds whole heads. ALiBi is sliced to the local heads by a pre-hook. Embeddings and the tied LM head stay
replicated so the loss stays an ordinary cross-entropy (shard the vocabulary for BLOOM-7B). Sequence parallel runs the
LayerNorms on ``T/tp`` tokens: same bytes, ``1/tp`` of their activations.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from ecomkit.errors import ConfigError

TP_ATTRIBUTE = "_ecomkit_tp"   # set on BloomAttention modules once they are split


def bloom_blocks(model: nn.Module) -> nn.ModuleList:
    """The ``transformer.h`` list of a ``BloomForCausalLM`` (or of a pipeline stage built from one)."""
    transformer = getattr(model, "transformer", model)
    blocks = getattr(transformer, "h", None)
    if blocks is None:
        raise ConfigError(
            f"Tensor parallelism here is planned for BLOOM (transformer.h blocks), but {type(model).__name__} has "
            "no transformer.h. Use --strategy fsdp for other architectures.")
    return blocks


def bloom_block_tp_plan(sequence_parallel: bool = False) -> dict[str, Any]:
    """``parallelize_module`` plan for one ``BloomBlock`` (module path → ParallelStyle)."""
    if not sequence_parallel:
        return {
            "self_attention.query_key_value": ColwiseParallel(),
            "self_attention.dense": RowwiseParallel(),
            "mlp.dense_h_to_4h": ColwiseParallel(),
            "mlp.dense_4h_to_h": RowwiseParallel(),
        }
    # Sequence-sharded activations stay DTensors (use_local_output=False) so residual adds see matching layouts.
    return {
        "input_layernorm": SequenceParallel(),
        "self_attention.query_key_value": ColwiseParallel(input_layouts=Shard(1)),
        "self_attention.dense": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
        "post_attention_layernorm": SequenceParallel(),
        "mlp.dense_h_to_4h": ColwiseParallel(input_layouts=Shard(1)),
        "mlp.dense_4h_to_h": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    }


def slice_alibi_to_local_heads(alibi: torch.Tensor, n_head: int, first: int, count: int) -> torch.Tensor:
    """``[batch·H, 1, T]`` ALiBi bias → this rank's ``[batch·count, 1, T]`` (heads ``first … first+count-1``)."""
    batch = alibi.shape[0] // n_head
    per_head = alibi.view(batch, n_head, *alibi.shape[1:])
    return per_head[:, first:first + count].reshape(batch * count, *alibi.shape[1:])


def _alibi_pre_hook(n_head: int, first: int, count: int):
    def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if "alibi" in kwargs:
            kwargs["alibi"] = slice_alibi_to_local_heads(kwargs["alibi"], n_head, first, count)
        else:  # BloomAttention.forward(hidden_states, residual, alibi, ...)
            args = args[:2] + (slice_alibi_to_local_heads(args[2], n_head, first, count),) + args[3:]
        return args, kwargs

    return hook


def shard_attention_heads(attention: nn.Module, tp_rank: int, tp_size: int) -> None:
    """Make one ``BloomAttention`` compute only heads ``tp_rank·H/tp …``: head count and ALiBi slice."""
    n_head = attention.num_heads
    if n_head % tp_size:
        raise ConfigError(f"tp={tp_size} does not divide the {n_head} attention heads (config field n_head). "
                          "Choose a --parallel-tp that divides it.")
    local = n_head // tp_size
    attention.num_heads = local
    attention.register_forward_pre_hook(_alibi_pre_hook(n_head, tp_rank * local, local), with_kwargs=True)
    setattr(attention, TP_ATTRIBUTE, {"global_heads": n_head, "local_heads": local, "first_head": tp_rank * local})


def _replicated_to_sequence_shards(model: nn.Module, tp_mesh: Any) -> None:
    """With sequence parallel: cut the replicated embedding output along T, gather before the LM head.

    The cut is at ``word_embeddings_layernorm``'s input, since BLOOM reads T for the mask and ALiBi from the embedding
    output; a DTensor redistribute makes backward all-gather the gradient.
    """
    transformer = model.transformer

    def shard_sequence(module: nn.Module, inputs: tuple) -> tuple:
        full = DTensor.from_local(inputs[0], tp_mesh, [Replicate()], run_check=False)
        return (full.redistribute(tp_mesh, [Shard(1)]),) + tuple(inputs[1:])

    def gather_sequence(module: nn.Module, inputs: Any, output: Any) -> torch.Tensor:
        return output.redistribute(tp_mesh, [Replicate()]).to_local()

    # registered before SequenceParallel's own hooks, so they run first
    transformer.word_embeddings_layernorm.register_forward_pre_hook(shard_sequence)
    parallelize_module(transformer, tp_mesh, {
        "word_embeddings_layernorm": SequenceParallel(),
        "ln_f": SequenceParallel(),
    })
    transformer.ln_f.register_forward_hook(gather_sequence)


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, sequence_parallel: bool = False) -> nn.Module:
    """Split every BLOOM block of ``model`` over ``tp_mesh`` in place; returns ``model``."""
    tp_size, tp_rank = tp_mesh.size(), tp_mesh.get_local_rank()
    if tp_size == 1:
        return model
    plan = bloom_block_tp_plan(sequence_parallel)
    for block in bloom_blocks(model):
        parallelize_module(block, tp_mesh, plan)
        shard_attention_heads(block.self_attention, tp_rank, tp_size)
    if sequence_parallel:
        _replicated_to_sequence_shards(model, tp_mesh)
    return model

