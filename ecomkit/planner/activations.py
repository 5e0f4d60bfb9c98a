"""Activation bytes of a BLOOM: what autograd saves between forward and backward, predicted from the shape.

Why a formula: the planner sizes a job without running it; the tests hold it to the tensors autograd really saves. Per
layer ``x·(2r + 14c)`` bytes with ``x = micro_batch · T · hidden`` (``r`` the residual dtype, ``c`` the compute dtype),
plus eager attention's ``[b, heads, T, T]`` fp32 probabilities (SDPA keeps q, k, v and the output instead).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ecomkit.config import DEEPSPEED_PLAN_STRATEGIES
from ecomkit.planner.shapes import ModelShape

@dataclass(frozen=True)
class ActivationDtypes:
    """Bytes per element: residual stream (LayerNorm inputs), compute (matmul inputs), LayerNorm statistics."""

    residual: int
    compute: int
    stats: int
    weight_copies: bool     # autocast keeps a 16-bit copy of every matmul weight until backward
    embedding_ln_input: int


def activation_dtypes(strategy: str, precision: str) -> ActivationDtypes:
    """What each strategy runs in: fp32; torch autocast (fp32 weights); or 16-bit modules (DeepSpeed, FSDP2 bf16)."""
    if precision == "fp32":
        return ActivationDtypes(4, 4, 4, False, 4)
    if strategy in DEEPSPEED_PLAN_STRATEGIES:          # the module itself is bf16/fp16
        return ActivationDtypes(2, 2, 2, False, 2)
    if strategy in ("fsdp2", "tp", "pp"):         # FSDP2 gathers 16-bit params; autocast keeps LayerNorms fp32
        return ActivationDtypes(4, 2, 4, False, 2)
    return ActivationDtypes(4, 2, 4, True, 4)     # DDP + autocast: fp32 weights cast per forward


def sdpa_width(head_dim: int, device: str) -> int:
    """Head width SDPA runs at: one extra channel carries ALiBi; CUDA kernels want a multiple of 8."""
    multiple = 8 if device == "cuda" else 1
    return -(-(head_dim + 1) // multiple) * multiple


def layer_activation_bytes(shape: ModelShape, batch: int, seq: int, dt: ActivationDtypes, attn: str = "eager",
                           tp: int = 1, device: str = "cuda") -> dict[str, int]:
    """Bytes one transformer block saves for backward, split into "layer" and "attention_scores"."""
    x = batch * seq * shape.hidden
    heads = shape.n_head // tp
    r, c = dt.residual, dt.compute
    # LN1 in, LN2 in (r); qkv input, MLP input (c, full width); context, GELU in/out (c, tp-split)
    dense = x * (2 * r + 2 * c) + (x // tp) * c * (1 + 8)
    stats = 2 * 2 * batch * seq * dt.stats
    if attn == "sdpa":
        width = sdpa_width(shape.head_dim, device)
        qkvo = 4 * batch * heads * seq * width * c
        return {"layer": dense + stats + qkvo + 4 * batch * heads * seq, "attention_scores": 0}
    qkv = 3 * (x // tp) * c
    scores = batch * heads * seq * seq * (4 + (c if c != 4 else 0))   # fp32 softmax output (+ 16-bit copy)
    return {"layer": dense + stats + qkv, "attention_scores": scores}


def activation_bytes(shape: ModelShape, batch: int, seq: int, *, strategy: str = "ddp", precision: str = "fp32",
                     attn: str = "eager", checkpointing: bool = False, tp: int = 1, layers: int | None = None,
                     with_embedding: bool = True, with_head: bool = True, device: str = "cuda",
                     loss_chunk: int = 0) -> dict[str, int]:
    """Bytes autograd keeps between forward and backward for one micro-batch, by part.

    Parts: ``blocks``, ``attention_scores`` (eager attention), ``embedding`` and ``head`` (``ln_f``, LM-head input, the
    loss's fp32 log-probabilities). With checkpointing a block keeps only its input; with several ``loss_chunk`` chunks
    the log-probabilities are recomputed and the labelled hidden states kept instead (modelled, not measured).
    """
    dt = activation_dtypes(strategy, precision)
    layers = shape.n_layer if layers is None else layers
    x = batch * seq * shape.hidden
    per = layer_activation_bytes(shape, batch, seq, dt, attn, tp, device)
    out = {"blocks": 0, "attention_scores": 0, "embedding": 0, "head": 0}
    if checkpointing:
        out["blocks"] = layers * x * dt.residual
    else:
        out["blocks"] = layers * per["layer"]
        out["attention_scores"] = layers * per["attention_scores"]
    ln_stats = 2 * batch * seq * dt.stats
    if with_embedding:
        out["embedding"] = 8 * batch * seq + x * dt.embedding_ln_input + ln_stats
    if with_head:
        logprobs = head_logprob_bytes(shape, batch, seq, loss_chunk)
        if 0 < loss_chunk < batch * (seq - 1):
            logprobs = batch * (seq - 1) * shape.hidden * dt.compute
        out["head"] = x * dt.residual + ln_stats + x * dt.compute + logprobs + 8 * batch * (seq - 1)
    out["total"] = sum(out.values())
    return out


def head_logprob_bytes(shape: ModelShape, batch: int, seq: int, loss_chunk: int = 0) -> int:
    """The fp32 log-probabilities ``[b, T-1, V]`` the loss keeps for backward; none with several loss chunks."""
    return 0 if 0 < loss_chunk < batch * (seq - 1) else 4 * batch * (seq - 1) * shape.vocab


def checkpointing_factor(shape: ModelShape, batch: int, seq: int, **kw: Any) -> float:
    """Predicted ratio of saved activations without / with activation checkpointing."""
    full = activation_bytes(shape, batch, seq, checkpointing=False, **kw)["total"]
    ckpt = activation_bytes(shape, batch, seq, checkpointing=True, **kw)["total"]
    return full / ckpt


__all__ = ["ActivationDtypes", "activation_dtypes", "sdpa_width", "layer_activation_bytes", "activation_bytes", "head_logprob_bytes",
           "checkpointing_factor"]
