"""Fused attention for transformers' BLOOM: ``--attn eager | sdpa | flex``.

Why: transformers' ``BloomAttention`` only has an eager path. Every layer
materialises the ``[batch, heads, T, T]`` score tensor, keeps its softmax for
backward and builds the same-sized gradients, so at long sequences attention
dominates memory and time. ``scaled_dot_product_attention`` (SDPA) never keeps
the probabilities: it saves the inputs and a log-sum-exp per row and
recomputes in backward.

How it is installed (the one place that changes the model): the class of every
``BloomAttention`` module is swapped in place for a subclass that overrides
only ``forward`` (``module.__class__ = BloomSdpaAttention``). Parameters,
``state_dict`` keys, ``isinstance`` checks, hooks and ``save_pretrained``
output are untouched, so DDP, DeepSpeed ZeRO, FSDP2, tensor parallelism and
``gradient_checkpointing_enable()`` wrap the model as before; ``install_attention(model, "eager")`` swaps
back to BLOOM's forward (:class:`BloomEagerAttention`, one-pass QKV split; under bf16 autocast on CPU
its mask and softmax in bf16, ``fast/attention_lowp.py``). Nothing of BLOOM is copied: the
subclass reuses ``query_key_value``, ``dense``, ``attention_dropout`` and transformers' ``dropout_add``.

What BLOOM's eager forward computes, and how each piece maps here:

- scores = ``alibi.baddbmm(q, kᵀ, beta=self.beta, alpha=self.inv_norm_factor)``
  + the 4-D additive causal/padding mask (0 or the dtype's minimum). ALiBi
  depends only on (batch, head, key), so it is folded into one extra channel
  of q and k (:func:`alibi_in_qk`): ``[q·scale, 1]·[k, beta·alibi]``. SDPA then
  needs only the model's own ``[batch, 1, q, kv]`` mask, shared by all heads
  and layers, or ``is_causal=True`` when the batch has no padding
  (:func:`sdpa_mask_plan`). A ``[batch, heads, q, kv]`` bias would have been
  the same size as the tensor this module exists to avoid.
  This transformers version has no layer-number scaling (``beta`` is 1 and
  ``inv_norm_factor`` is 1/√head_dim); both are read from the module, so a
  version or checkpoint that changes them is still followed.
- the fused QKV layout ``[heads, 3, head_dim]`` → :meth:`BloomEagerAttention._reshape` (one ``unbind``).
- heads: always ``self.num_heads`` and the ``alibi`` argument, never the config.
  The tensor-parallel pre-hook (chapter 04) sets ``num_heads = n_head / tp`` and
  slices ``alibi`` to the rank's heads; this forward follows it unchanged.
- attention dropout → ``dropout_p`` of SDPA (same probability, different random
  stream, so with dropout > 0 runs agree in distribution, not bit for bit; on
  CPU torch's fused kernel has no dropout and SDPA falls back to its math
  kernel). The presets set dropout to 0.
- ``pretraining_tp > 1 and slow_but_exact`` → the same sliced ``dense``.
- return value: ``(output, None)``; the block expects ``(hidden, attn_weights)``.
  ``output_attentions=True`` needs the probabilities, so that call falls back
  to the eager forward.

Masks (``models/attention.py``, what the model takes whichever path runs): SDPA's mask plan, the
document masks of packed rows (``ecomkit.data.packing``) with ALiBi positions
read from them, and flex's block masks.

Head-dim padding (sdpa on CUDA): the ALiBi channel makes q and k one wider than the head, rounded up to
a multiple of 8 for the aligned kernels (64 → 72, 128 → 136); docs/perf.md has what that costs.

``flex`` uses ``torch.nn.attention.flex_attention``: ALiBi is a ``score_mod``
and the causal/padding mask a block mask (fully masked blocks are skipped).
The ``score_mod`` (:class:`AlibiScoreMod`) is built once per model by
:func:`install_attention` and shared by every layer and call, so the compiled
function sees one function object and compiles once per shape (a second
length recompiles once with dynamic sizes; tests/test_attention.py counts).
It is meant for GPUs, where it is compiled. On CPU torch has
no FlexAttention backward and compiling its forward takes ~50 s, so
``install_attention(model, "flex")`` on a CPU model refuses with a
``ConfigError`` for training and, with ``for_training=False``, runs the
unfused forward (a correctness reference, not a fast path). One visible
difference: rows whose keys are all masked (padding queries under left
padding) come out as zeros with flex and as a uniform average with eager.
ecomkit pads on the right, where no such row exists; the tests compare flex
on the real tokens only.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import flex_attention
from transformers.models.bloom import modeling_bloom
from transformers.models.bloom.modeling_bloom import BloomAttention, dropout_add

from ecomkit.config import ATTN_IMPLS as ATTN_CHOICES  # eager | sdpa | flex: one list for flag and module
from ecomkit.errors import ConfigError, EcomkitError
from ecomkit.fast.attention_lowp import cpu_bf16_autocast, eager_attend
from ecomkit.models.attention import _cached_block_mask, sdpa_mask_plan, use_mask_positions  # the masks' home

# The forward signature this module was written against (transformers 5.x).
_EXPECTED_PARAMS = ("hidden_states", "residual", "alibi", "attention_mask", "layer_past", "use_cache",
                    "output_attentions")


# ---------------------------------------------------------------------- shared pieces
def alibi_in_qk(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, alibi: torch.Tensor,
                num_heads: int, scale: float, beta: float, multiple: int = 1
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold ALiBi into the dot product: ``[q·scale, 1] · [k, beta·alibi] = scale·q·k + beta·alibi``.

    Why: BLOOM's ALiBi term depends on (batch, head, key) only, so it fits in one
    extra channel of q and k. SDPA then needs just the model's own
    ``[batch, 1, q, kv]`` mask (shared by all heads and layers) instead of a
    ``[batch, heads, q, kv]`` bias: no tensor that grows with heads·T² exists.
    The ALiBi values are used exactly as the model built them; the only extra
    rounding is ``q·scale`` (exact when head_dim is a power of 4). ``value`` is
    zero-padded to the same width because fused kernels require equal head
    dims; ``multiple`` rounds the width up (8 on CUDA, for the aligned kernels).
    """
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

    Why: BLOOM's ``_reshape`` takes three ``select`` views (the same views), but each select's backward
    zero-fills a gradient of the whole fused tensor and adds it in; ``unbind``'s backward writes it once
    (``benchmarks/bench_kernels.py``). Bit-identical gradients (tests/test_attention.py); the fused paths inherit it.
    Under bf16 autocast on CPU the scores' mask and softmax stay in bf16 (``fast/attention_lowp.py``);
    everywhere else this runs transformers' forward. The fused paths reuse :meth:`forward` with their ``_attend``.
    """

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


class _FusedBloomAttention(BloomEagerAttention):
    """The fused paths' base: :meth:`BloomEagerAttention.forward` always, with the subclass's ``_attend``."""

    def _own_forward(self, hidden_states: torch.Tensor) -> bool:
        return True


class BloomSdpaAttention(_FusedBloomAttention):
    """BLOOM attention through ``F.scaled_dot_product_attention``, ALiBi folded into q·k."""

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


# ---------------------------------------------------------------------- flex
_COMPILED_FLEX: Any = None


def _flex_function(device: torch.device):
    """Compiled ``flex_attention`` on GPU (built once), the unfused reference elsewhere.

    Compiled with torch's default dynamic-shape policy: the first shape compiles
    a static kernel, a second shape recompiles once with dynamic sizes, so
    length-bucketed batches do not recompile for every new length.
    """
    global _COMPILED_FLEX
    if device.type == "cpu":
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention)
    return _COMPILED_FLEX


class BloomFlexAttention(_FusedBloomAttention):
    """BLOOM attention through FlexAttention: ALiBi as ``score_mod``, causal+padding as a block mask."""

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

    Why once: the compiled ``flex_attention`` is traced with its ``score_mod``;
    a fresh closure per layer and per call invites a recompilation (and at
    least re-guarding) for each. Here ``fn`` is one function object for the
    whole model; each layer only stores this forward's ``[batch, heads, kv]``
    bias in ``self.bias`` before calling, which the compiled graph reads as an
    input (its shape, not its identity, is what is guarded).
    tests/test_attention.py counts the compilations.
    """

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

_CLASSES: dict[str, type[BloomAttention]] = {
    "eager": BloomAttention,
    "sdpa": BloomSdpaAttention,
    "flex": BloomFlexAttention,
}


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

    Call it before wrapping the model (DDP/ZeRO/FSDP2/TP) or after: only the
    modules' classes change. ``for_training=False`` allows the unfused flex
    forward on CPU (a correctness check).
    """
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
        _check_flex_usable(modules[0], for_training)
        score_mod = AlibiScoreMod()  # one per model: see AlibiScoreMod
        for m in modules:
            m._ecomkit_alibi_score = score_mod
    for m in modules:
        m.__class__ = _CLASSES[impl]
    return len(modules)


def current_attention(model: nn.Module) -> str:
    """The name of the implementation installed on ``model`` ('mixed' if modules disagree)."""
    def name(m: BloomAttention) -> str:
        return next((k for k in ("flex", "sdpa") if isinstance(m, _CLASSES[k])), "eager")

    names = {name(m) for m in attention_modules(model)}
    return names.pop() if len(names) == 1 else "mixed"


def _check_flex_usable(module: BloomAttention, for_training: bool) -> None:
    device = module.query_key_value.weight.device
    if device.type == "cpu" and for_training:
        raise ConfigError(_FLEX_CPU_MESSAGE)


__all__ = ["ATTN_CHOICES", "BloomEagerAttention", "BloomSdpaAttention", "BloomFlexAttention", "install_attention",
           "current_attention", "attention_modules", "alibi_in_qk", "check_transformers_compatible"]
