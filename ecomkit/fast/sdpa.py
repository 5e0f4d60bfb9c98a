"""``--attn sdpa``: BLOOM attention through ``F.scaled_dot_product_attention``, ALiBi folded into q·k.

Why: eager keeps the ``[batch, heads, T, T]`` probabilities for backward, SDPA a log-sum-exp per row. Loaded only
when a run's attention is sdpa (``fast.attention.SDPA``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from ecomkit.fast.attention import FusedBloomAttention
from ecomkit.models.attention import sdpa_mask_plan  # the masks' home


def alibi_in_qk(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, alibi: torch.Tensor,
                num_heads: int, scale: float, beta: float, multiple: int = 1
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold ALiBi into the dot product: ``[q·scale, 1] · [k, beta·alibi] = scale·q·k + beta·alibi``.
    Why: ALiBi depends on (batch, head, key) only, so no ``[batch, heads, q, kv]`` bias is built. ``value`` is
    zero-padded to the same width (fused kernels need equal head dims); ``multiple`` rounds it up (8 on CUDA)."""
    batch, _, q_len, head_dim = query.shape
    kv_len = key.shape[2]
    width = -(-(head_dim + 1) // multiple) * multiple
    slope_pos = alibi.view(batch, num_heads, kv_len, 1).to(key.dtype)
    if beta != 1.0:
        slope_pos = slope_pos * beta
    extra = width - head_dim - 1
    q_aug = torch.cat([query * scale, query.new_ones(batch, num_heads, q_len, 1)], dim=-1)
    k_aug = torch.cat([key, slope_pos], dim=-1)
    v_aug = value
    if extra:
        q_aug = F.pad(q_aug, (0, extra))
        k_aug = F.pad(k_aug, (0, extra))
    if width != head_dim:
        v_aug = F.pad(value, (0, width - head_dim))
    return q_aug, k_aug, v_aug


class BloomSdpaAttention(FusedBloomAttention):
    """BLOOM attention through ``F.scaled_dot_product_attention``, ALiBi folded into q·k."""

    ecomkit_attn = "sdpa"

    def _attend(self, query, key, value, alibi, attention_mask) -> torch.Tensor:
        head_dim = query.shape[-1]
        multiple = 8 if query.device.type == "cuda" else 1
        q, k, v = alibi_in_qk(query, key, value, alibi, self.num_heads, self.inv_norm_factor, self.beta, multiple)
        plan = sdpa_mask_plan(alibi, attention_mask, query.shape[2])
        mask = plan.attn_mask
        if mask is not None and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)
        dropout = self.attention_dropout.p if self.training else 0.0
        exact_backward = plan.has_empty_rows and torch.is_grad_enabled() and q.requires_grad
        with sdpa_kernel(SDPBackend.MATH) if exact_backward else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                                 is_causal=plan.is_causal, scale=1.0)
        return out[..., :head_dim]


__all__ = ["BloomSdpaAttention", "alibi_in_qk"]
