"""``--attn flex``: BLOOM attention through FlexAttention, ALiBi as a ``score_mod`` and the mask as a block mask.

Why apart: it is for GPUs (a CPU has no FlexAttention backward), so a run loads it only when ``--attn flex`` asks
(``fast.attention.FLEX``); the forward around it is :class:`~ecomkit.fast.attention.FusedBloomAttention`'s.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch.nn.attention.flex_attention import flex_attention
from transformers.models.bloom.modeling_bloom import BloomAttention

from ecomkit.errors import ConfigError
from ecomkit.fast.attention import FusedBloomAttention
from ecomkit.models.attention import _cached_block_mask  # the masks' home

_COMPILED_FLEX: Any = None


def _flex_function(device: torch.device):
    """Compiled ``flex_attention`` on GPU (built once, dynamic shapes after a second length), unfused elsewhere."""
    global _COMPILED_FLEX
    if device.type == "cpu":
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention)
    return _COMPILED_FLEX


class BloomFlexAttention(FusedBloomAttention):
    """BLOOM attention through FlexAttention: ALiBi as ``score_mod``, causal+padding as a block mask."""

    ecomkit_attn = "flex"

    def _attend(self, query, key, value, alibi, attention_mask) -> torch.Tensor:
        if self.training and self.attention_dropout.p > 0:
            raise ConfigError(
                f"attn='flex' has no attention dropout, but this model's attention_dropout is "
                f"{self.attention_dropout.p}. Use --attn sdpa, or set attention_dropout=0 in the model config.")
        if query.device.type == "cpu" and torch.is_grad_enabled() and query.requires_grad:
            raise ConfigError(_FLEX_CPU_MESSAGE)
        batch, q_length, kv_length = query.shape[0], query.shape[2], key.shape[2]
        block_mask = _cached_block_mask(alibi, attention_mask, batch, q_length, kv_length, query.device)
        score_mod = self._ecomkit_alibi_score
        score_mod.bias = alibi.reshape(batch, self.num_heads, kv_length) * self.beta
        flex = _flex_function(query.device)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
            return flex(query, key, value, score_mod=score_mod.fn, block_mask=block_mask,
                        scale=self.inv_norm_factor)


class AlibiScoreMod:
    """BLOOM's ALiBi as a FlexAttention ``score_mod``: built once per model, shared by every layer and call.
    Why: the compiled ``flex_attention`` guards its ``score_mod``; one function object reading ``self.bias`` as an
    input compiles once per shape instead of once per layer and call."""

    def __init__(self) -> None:
        self.bias: torch.Tensor | None = None
        holder = self

        def alibi_score(score, b, h, q, kv):
            return score + holder.bias[b, h, kv].to(score.dtype)

        self.fn = alibi_score


_FLEX_CPU_MESSAGE = (
    "attn='flex' cannot train on CPU: torch's FlexAttention has no CPU backward, and compiling its "
    "forward for the CPU takes about a minute per shape. Use --attn sdpa on CPU (same results, "
    "tested equal to eager); keep --attn flex for GPU runs.")


def prepare_flex(modules: list[BloomAttention], for_training: bool) -> type[BloomAttention]:
    """Check flex can run here, give ``modules`` one shared :class:`AlibiScoreMod`; the class to install."""
    if modules[0].query_key_value.weight.device.type == "cpu" and for_training:
        raise ConfigError(_FLEX_CPU_MESSAGE)
    score_mod = AlibiScoreMod()  # one per model: see AlibiScoreMod
    for m in modules:
        m._ecomkit_alibi_score = score_mod
    return BloomFlexAttention


__all__ = ["AlibiScoreMod", "BloomFlexAttention", "prepare_flex"]
