"""Tensor parallelism for BLOOM blocks (Megatron-style), with ``parallelize_module`` on a DeviceMesh.

The plan per block (tp ranks, ``H`` heads, hidden ``h``):

=========================================  ================  ====================================
module                                     style             local weight on each rank
=========================================  ================  ====================================
``self_attention.query_key_value``         ColwiseParallel   ``[3h/tp, h]``: whole heads (below)
``self_attention.dense``                   RowwiseParallel   ``[h, h/tp]``; output all-reduced
``mlp.dense_h_to_4h``                      ColwiseParallel   ``[4h/tp, h]``
``mlp.dense_4h_to_h``                      RowwiseParallel   ``[h, 4h/tp]``; output all-reduced
``input/post_attention_layernorm``         replicated, or SequenceParallel (``sequence_parallel=True``)
=========================================  ================  ====================================

So each block costs two all-reduces of the activations ``[batch, T, h]`` in
forward and two in backward (the column-parallel inputs' gradients).

**Why contiguous column sharding of the fused QKV is right for BLOOM.** The
output features of ``query_key_value`` are laid out ``[heads, 3, head_dim]``
(BLOOM's ``_reshape`` views them as ``(H, 3, d)``), not ``[3, heads, head_dim]``
as in GPT-2/Megatron's "q | k | v" layout. A contiguous chunk ``r`` of the
``3h`` rows therefore holds heads ``r·H/tp … (r+1)·H/tp - 1``, each with its
own q, k and v, and ``_reshape`` on the local ``[.., 3h/tp]`` output still
works once the module's ``num_heads`` is ``H/tp``. (With a q|k|v layout, a
contiguous split would hand rank 0 all the queries and rank 1 all the values;
the ``tests/test_tensor_parallel.py`` check compares against the unsplit model.)

**ALiBi.** The slopes depend on the head index, and BloomModel builds the
bias ``[batch·H, 1, T]`` for all heads before the blocks run. A forward
pre-hook on each ``self_attention`` keeps this rank's heads (overriding
``build_alibi_tensor`` is not enough, BLOOM skips it
when there is no attention mask). The fused attention in
``ecomkit.models.attention`` (``--attn sdpa``) reads ``num_heads`` and
``alibi`` from the module and its arguments, so it follows both changes.

**Embeddings and LM head stay replicated** (plain tensors, identical on every
tp rank). Sharding the vocabulary would save ``(tp-1)/tp · V·h`` per rank (the
embedding is tied to the head), but then the logits come out sharded over
the vocabulary and the loss must be computed in parallel (``loss_parallel``);
the training loop computes one ordinary cross-entropy on full logits for every
strategy, and keeping it that way is worth ``V·h`` bytes on the tiny models
here. For BLOOM-7B (V = 250,880) that is 1 GiB of bf16 per rank: shard it there.

**Sequence parallel** (optional): the LayerNorms (and dropout/residual adds)
between the TP regions run on ``T/tp`` of the tokens; the column-parallel
layers all-gather their input along the sequence and the row-parallel ones
reduce-scatter their output instead of all-reducing it. Same bytes on the
wire, ``1/tp`` of the LayerNorm activations stored per rank.
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
    # Sequence-sharded activations between the TP regions stay DTensors
    # (use_local_output=False) so that residual adds see matching layouts.
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
    """With sequence parallel: cut the (replicated) embedding output along T, gather before the LM head.

    The cut happens at the input of ``word_embeddings_layernorm``, not at the
    embedding's output: BloomModel reads the sequence length for the causal
    mask and ALiBi from the embedding output, which must stay full-length.
    Going through a DTensor redistribute (Replicate → Shard(1)) makes the
    backward all-gather the gradient, so the replicated embedding still gets
    the gradient of every position.
    """
    transformer = model.transformer

    def shard_sequence(module: nn.Module, inputs: tuple) -> tuple:
        full = DTensor.from_local(inputs[0], tp_mesh, [Replicate()], run_check=False)
        return (full.redistribute(tp_mesh, [Shard(1)]),) + tuple(inputs[1:])

    def gather_sequence(module: nn.Module, inputs: Any, output: Any) -> torch.Tensor:
        # the LM head is replicated: it needs every position of every sequence
        return output.redistribute(tp_mesh, [Replicate()]).to_local()

    # registered before SequenceParallel's own hooks, so they run first
    transformer.word_embeddings_layernorm.register_forward_pre_hook(shard_sequence)
    parallelize_module(transformer, tp_mesh, {
        "word_embeddings_layernorm": SequenceParallel(),
        "ln_f": SequenceParallel(),
    })
    transformer.ln_f.register_forward_hook(gather_sequence)


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, sequence_parallel: bool = False) -> nn.Module:
    """Split every BLOOM block of ``model`` over ``tp_mesh`` in place; returns ``model``.

    Embeddings, the final LayerNorm and the (tied) LM head stay replicated; see
    the module docstring for why.
    """
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

