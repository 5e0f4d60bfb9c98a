"""BLOOM's eager attention with its mask and softmax in bf16, under bf16 autocast on CPU.

Why: transformers' path casts the ``[batch, heads, T, T]`` scores to fp32 and back, four passes per layer that do
no arithmetic; ATen's bf16 softmax accumulates in fp32 anyway. The fp32 mask minimum rounds to -inf in bf16 (a
fully masked row would give NaN), so it is clamped to bf16's minimum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_MASK_ATTR = "_ecomkit_low_precision_mask"


def cpu_bf16_autocast(t: torch.Tensor) -> bool:
    """True when ``t`` is on the CPU inside a bf16 autocast region (the loop's ``--precision bf16`` on CPU)."""
    return (t.device.type == "cpu" and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") == torch.bfloat16)


def low_precision_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """BLOOM's additive mask in ``dtype``, its minimum clamped to ``dtype``'s; cached on the mask.
    Why cached: BloomModel hands the same mask object to every block, so it is converted once per forward."""
    if torch.compiler.is_compiling():   # no attributes on tensors inside a graph; the conversion is cheap
        return mask.clamp(min=torch.finfo(dtype).min).to(dtype)
    cached = getattr(mask, _MASK_ATTR, None)
    if cached is None or cached.dtype != dtype:
        cached = mask.clamp(min=torch.finfo(dtype).min).to(dtype)
        setattr(mask, _MASK_ATTR, cached)
    return cached


def eager_attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, alibi: torch.Tensor,
                 attention_mask: torch.Tensor | None, beta: float, scale: float, dropout: nn.Module
                 ) -> torch.Tensor:
    """BLOOM's eager attention on ``[batch, heads, T, head_dim]`` q, k, v, with no fp32 round trip of the scores."""
    batch, heads, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    scores = alibi.baddbmm(query.reshape(batch * heads, q_len, head_dim),
                           key.reshape(batch * heads, kv_len, head_dim).transpose(-1, -2), beta=beta, alpha=scale)
    weights = scores.view(batch, heads, q_len, kv_len)
    if attention_mask is not None:
        weights = weights + low_precision_mask(attention_mask, weights.dtype)
    probs = dropout(F.softmax(weights, dim=-1))
    context = torch.bmm(probs.view(batch * heads, q_len, kv_len), value.reshape(batch * heads, kv_len, head_dim))
    return context.view(batch, heads, q_len, head_dim)


__all__ = ["cpu_bf16_autocast", "eager_attend", "low_precision_mask"]
