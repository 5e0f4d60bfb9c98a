"""BLOOM's attention for training: ``--attn eager`` here, ``sdpa`` and ``flex`` (GPUs) found by name when asked.

Why a class swap: each ``BloomAttention``'s class becomes a subclass that overrides ``forward`` only, so parameters,
``state_dict`` keys, hooks and every strategy's wrapping are untouched.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.bloom import modeling_bloom
from transformers.models.bloom.modeling_bloom import BloomAttention, dropout_add

from ecomkit import find
from ecomkit.config import ATTN_IMPLS as ATTN_CHOICES  # eager | sdpa | flex: one list for flag and module
from ecomkit.errors import ConfigError, EcomkitError
from ecomkit.models.attention import use_mask_positions  # the masks' home

# The forward signature this module was written against (transformers 5.x).
_EXPECTED_PARAMS = ("hidden_states", "residual", "alibi", "attention_mask", "layer_past", "use_cache",
                    "output_attentions")


# ---------------------------------------------------------------------- eager in bf16 on CPU
# Why: transformers casts the [batch, heads, T, T] scores to fp32 and back, four passes per layer that do no
# arithmetic; ATen's bf16 softmax accumulates in fp32 anyway. The fp32 mask minimum rounds to -inf in bf16
# (a fully masked row would give NaN), so it is clamped to bf16's minimum.
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


def _project_output(attn: BloomAttention, context: torch.Tensor) -> torch.Tensor:
    """The output ``dense``, including BLOOM's ``pretraining_tp``/``slow_but_exact`` slicing."""
    if attn.pretraining_tp > 1 and attn.slow_but_exact:
        slices = attn.hidden_size / attn.pretraining_tp
        out = torch.zeros_like(context)
        for i in range(attn.pretraining_tp):
            lo, hi = int(i * slices), int((i + 1) * slices)
            out = out + F.linear(context[:, :, lo:hi], attn.dense.weight[:, lo:hi])
        return out
    return attn.dense(context)


class BloomEagerAttention(BloomAttention):
    """BLOOM's own (eager) attention, with q, k and v taken from the fused QKV output by one ``unbind``.
    Why: each of BLOOM's three ``select`` views zero-fills a gradient of the whole fused tensor in backward;
    ``unbind`` writes it once. Under bf16 autocast on CPU the mask and softmax stay in bf16 (:func:`eager_attend`)."""

    def _reshape(self, fused_qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, length, _ = fused_qkv.shape
        q, k, v = fused_qkv.view(batch, length, self.num_heads, 3, self.head_dim).unbind(3)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _own_forward(self, hidden_states: torch.Tensor) -> bool:
        """Whether this class's forward runs (``_attend``), not transformers' (always, in the fused paths)."""
        return cpu_bf16_autocast(hidden_states)

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor, alibi: torch.Tensor,
                attention_mask: torch.Tensor | None, layer_past: Any = None, use_cache: bool = False,
                output_attentions: bool = False, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        if output_attentions or not self._own_forward(hidden_states):  # only eager materialises probabilities
            return BloomAttention.forward(self, hidden_states, residual, alibi, attention_mask, layer_past,
                                          use_cache, output_attentions, **kwargs)
        batch, q_length, _ = hidden_states.shape
        query, key, value = self._reshape(self.query_key_value(hidden_states))  # [b, h, T, d] each
        if layer_past is not None:
            key, value = layer_past.update(key, value, self.layer_idx)
        context = self._attend(query, key, value, alibi, attention_mask)
        context = context.transpose(1, 2).reshape(batch, q_length, self.num_heads * self.head_dim)
        output = _project_output(self, context)
        return dropout_add(output, residual, self.hidden_dropout, self.training), None

    def _attend(self, query, key, value, alibi, attention_mask) -> torch.Tensor:
        return eager_attend(query, key, value, alibi, attention_mask, self.beta, self.inv_norm_factor,
                            self.attention_dropout)


class FusedBloomAttention(BloomEagerAttention):
    """The fused paths' base: :meth:`BloomEagerAttention.forward` always, with the subclass's ``_attend``."""

    def _own_forward(self, hidden_states: torch.Tensor) -> bool:
        return True


SDPA = "ecomkit.fast.sdpa"   # --attn sdpa: found by name when asked
FLEX = "ecomkit.fast.flex"   # --attn flex (GPUs): found by name when asked


# ---------------------------------------------------------------------- install
def check_transformers_compatible() -> None:
    """Refuse to patch a BLOOM whose attention forward no longer has the arguments this module reads."""
    params = tuple(inspect.signature(BloomAttention.forward).parameters)[1:]
    if params[: len(_EXPECTED_PARAMS)] != _EXPECTED_PARAMS:
        raise EcomkitError(
            f"transformers' BloomAttention.forward now takes {params} (file {modeling_bloom.__file__}); "
            f"ecomkit.models.attention was written for {_EXPECTED_PARAMS}. Run with --attn eager, or pin "
            "the transformers version listed in pyproject.toml.")


def attention_modules(model: nn.Module) -> list[BloomAttention]:
    return [m for m in model.modules() if isinstance(m, BloomAttention)]


def install_attention(model: nn.Module, impl: str, *, for_training: bool = True) -> int:
    """Switch every BLOOM attention module of ``model`` to ``impl``; returns how many were switched.
    Only classes change, so it works before or after wrapping; ``for_training=False`` allows flex's unfused CPU
    forward (a correctness check)."""
    if impl not in ATTN_CHOICES:
        raise ConfigError(f"Unknown attn '{impl}'. Choose one of: {', '.join(ATTN_CHOICES)}.")
    modules = attention_modules(model)
    use_mask_positions(model)  # 4-D masks (packed rows) get ALiBi positions per row, in every impl
    if impl == "eager":  # BLOOM's computation, with the one-pass QKV split (BloomEagerAttention); 0 for other models
        for m in modules:
            m.__class__ = BloomEagerAttention
        return len(modules)
    if not modules:
        raise ConfigError(
            f"attn='{impl}' replaces BLOOM's attention, but {type(model).__name__} has no BloomAttention "
            "module. Pass --attn eager for other architectures.")
    check_transformers_compatible()
    if impl == "flex":
        cls = find(f"{FLEX}:prepare_flex")(modules, for_training)
    else:
        cls = find(f"{SDPA}:BloomSdpaAttention")
    for m in modules:
        m.__class__ = cls
    return len(modules)


def current_attention(model: nn.Module) -> str:
    """The name of the implementation installed on ``model`` ('mixed' if modules disagree)."""
    names = {getattr(m, "ecomkit_attn", "eager") for m in attention_modules(model)}
    return names.pop() if len(names) == 1 else "mixed"


__all__ = ["ATTN_CHOICES", "BloomEagerAttention", "FLEX", "FusedBloomAttention", "SDPA",
           "install_attention", "current_attention", "attention_modules",
           "check_transformers_compatible", "cpu_bf16_autocast", "eager_attend", "low_precision_mask"]
