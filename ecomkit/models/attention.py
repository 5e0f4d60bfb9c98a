"""BLOOM's attention: which one a run uses (``--attn auto``), and the masks it takes (SDPA's plan, documents, ALiBi).

Why one module: every attention path and strategy reads its mask here; the model never sees documents, only a mask.
``--attn auto``: SDPA wins on memory everywhere, but eager can be faster at short sequences; the crossovers are
measured per precision (CPU) and per GPU kind, and tests recompute them from the committed artifacts.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask
from transformers.models.bloom import modeling_bloom

_PLAN_ATTR = "_ecomkit_sdpa_mask_plan"


class MaskPlan(NamedTuple):
    """How one forward's mask is handed to SDPA (see :func:`sdpa_mask_plan`)."""

    attn_mask: torch.Tensor | None
    is_causal: bool
    has_empty_rows: bool  # some query row may attend to nothing (left padding)


def sdpa_mask_plan(alibi: torch.Tensor, attention_mask: torch.Tensor | None, q_length: int) -> MaskPlan:
    """Decide once per forward how to pass the mask to SDPA; cached on ``alibi`` (shared by every block).

    An unpadded batch gets ``is_causal=True`` and no mask; otherwise the additive mask is passed as is.
    ``has_empty_rows`` (left padding): torch's fused CPU backward mishandles query rows with no key, so the caller
    runs the exact math kernel. Under ``torch.compile`` no check runs: reading values breaks the graph of BloomModel's
    block loop, and both shortcuts only save work.
    """
    if torch.compiler.is_compiling():
        return MaskPlan(attention_mask, False, False)
    cached = getattr(alibi, _PLAN_ATTR, None)
    if cached is not None and cached[0] is attention_mask and cached[1] == q_length:
        return cached[2]
    plan = MaskPlan(attention_mask, False, False)
    if attention_mask is not None:
        allowed = attention_mask == 0
        square = attention_mask.shape[-1] == q_length == attention_mask.shape[-2]
        causal = torch.ones(q_length, q_length, dtype=torch.bool, device=allowed.device).tril() if square else None
        if causal is not None and torch.equal(allowed, causal.expand_as(allowed)):
            plan = MaskPlan(None, True, False)
        else:
            plan = MaskPlan(attention_mask, False, bool((~allowed.any(dim=-1)).any()))
    setattr(alibi, _PLAN_ATTR, (attention_mask, q_length, plan))
    return plan


# ---------------------------------------------------------------------- packed rows: document masks
def document_causal_mask(document_ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """BLOOM's additive ``[batch, 1, T, T]`` mask for packed rows: each token sees its own row's earlier tokens.
    ``document_ids`` ``[batch, T]`` numbers the packed rows; 0 (padding) forms one more row, so no query sees no key."""
    t = document_ids.shape[1]
    same = document_ids[:, :, None] == document_ids[:, None, :]
    causal = torch.ones(t, t, dtype=torch.bool, device=document_ids.device).tril()
    mask = torch.zeros(same.shape, dtype=dtype, device=document_ids.device)
    return mask.masked_fill_(~(same & causal), torch.finfo(dtype).min)[:, None]


_KNOWN_PLAN = "_ecomkit_known_plan"   # set on the masks built here: their plan, known without reading them


def attention_mask_for(batch: dict) -> torch.Tensor:
    """The mask a batch hands the model: a 4-D mask whose SDPA plan is known on the host, when it can be.

    Packed rows get their document mask; a training batch whose collator said ``has_padding`` gets a causal mask
    (padding as one more row); anything else its padding mask. Why: planning from the mask's values makes a GPU host
    wait for the device every step.
    """
    if "document_ids" in batch:
        return _known(document_causal_mask(batch["document_ids"]), causal=False)
    mask = batch["attention_mask"]
    if "has_padding" not in batch:
        return mask
    if batch["has_padding"]:
        return _known(document_causal_mask(mask), causal=False)
    batch_size, t = mask.shape
    causal = torch.full((t, t), torch.finfo(torch.float32).min, device=mask.device).triu(1)
    return _known(causal[None, None].expand(batch_size, 1, t, t), causal=True)


def _known(mask: torch.Tensor, causal: bool) -> torch.Tensor:
    """Mark ``mask`` with its plan: only whether it is plain causal, never a reference to the mask itself.
    Why: a mask holding a plan that holds the mask is a reference cycle, kept until the garbage collector runs."""
    setattr(mask, _KNOWN_PLAN, causal)
    return mask


def alibi_from_mask(attention_mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """BLOOM's ``build_alibi_tensor`` for a 2-D padding mask, and for a 4-D causal mask (packed rows).
    In a 4-D causal mask a key's row shows the keys before it, so their count minus one is its position within its
    own document: a packed row gets exactly the bias (and logits) it gets alone."""
    if attention_mask.dim() != 4:
        return modeling_bloom.build_alibi_tensor(attention_mask, num_heads, dtype)
    batch, t = attention_mask.shape[0], attention_mask.shape[-1]
    positions = (attention_mask[:, 0] == 0).sum(dim=-1) - 1                      # [batch, T]
    slopes = alibi_slopes(num_heads, attention_mask.device)
    alibi = (slopes[..., None] * positions[:, None, :]).reshape(batch * num_heads, 1, t).to(dtype)
    causal = getattr(attention_mask, _KNOWN_PLAN, None)
    if causal is not None and not torch.compiler.is_compiling():   # planned without reading: attention_mask_for
        plan = MaskPlan(None, True, False) if causal else MaskPlan(attention_mask, False, False)
        setattr(alibi, _PLAN_ATTR, (attention_mask, t, plan))
    return alibi


def use_mask_positions(model: nn.Module) -> None:
    """Every ``BloomModel`` of ``model`` builds ALiBi with :func:`alibi_from_mask`: packed rows' positions restart
    at each document (an instance attribute; BLOOM's own builder reads positions from a 2-D mask only)."""
    for m in model.modules():
        if isinstance(m, modeling_bloom.BloomModel):
            m.build_alibi_tensor = alibi_from_mask


def alibi_slopes(num_heads: int, device: torch.device) -> torch.Tensor:
    """BLOOM's per-head ALiBi slopes, read off its public ``build_alibi_tensor`` (position 1 of a 2-token row);
    transformers' private ``_get_alibi_slopes`` exists only from 5.21."""
    ones = torch.ones(1, 2, dtype=torch.long, device=device)
    return modeling_bloom.build_alibi_tensor(ones, num_heads, torch.float32).reshape(num_heads, 2)[:, 1]


# ---------------------------------------------------------------------- flex
def flex_block_mask(attention_mask: torch.Tensor | None, batch: int, q_length: int, kv_length: int,
                    device: torch.device):
    """A BlockMask from BLOOM's 4-D additive mask (0 = attend); ``None`` means a plain causal mask."""
    if attention_mask is None:
        offset = kv_length - q_length
        mask_mod = lambda b, h, q, kv: kv <= q + offset  # noqa: E731
        return create_block_mask(mask_mod, None, None, q_length, kv_length, device=device)
    allowed = attention_mask[:, 0] == 0  # [b, q, kv]
    mask_mod = lambda b, h, q, kv: allowed[b, q, kv]  # noqa: E731
    return create_block_mask(mask_mod, batch, None, q_length, kv_length, device=device)


def _cached_block_mask(alibi, attention_mask, batch, q_length, kv_length, device):
    """One BlockMask per forward, shared by all layers; an unpadded batch gets the plain causal block mask."""
    cached = getattr(alibi, "_ecomkit_block_mask", None)
    if cached is not None and cached[0] is attention_mask and cached[1] == q_length:
        return cached[2]
    if attention_mask is None:  # eager applies no mask at all then (not even causal); so does flex
        block_mask = None
    else:
        plain_causal = sdpa_mask_plan(alibi, attention_mask, q_length).is_causal
        block_mask = flex_block_mask(None if plain_causal else attention_mask, batch, q_length, kv_length, device)
    setattr(alibi, "_ecomkit_block_mask", (attention_mask, q_length, block_mask))
    return block_mask


# Per precision, the longest sequence length at which eager attention trained faster than SDPA on a CPU.
CPU_EAGER_MAX_SEQ: dict[str, int] = {"fp32": 0, "bf16": 256}
# Per GPU kind, per precision, the same crossover on that GPU; empty while unmeasured (auto is sdpa there).
GPU_EAGER_MAX_SEQ: dict[str, dict[str, int]] = {}


def pick_attention(requested: str, precision: str, device_type: str, seq_len: int,
                   eager_max_seq: dict[str, int] | None = None, gpu_kind: str | None = None,
                   gpu_eager_max_seq: dict[str, dict[str, int]] | None = None) -> tuple[str, str]:
    """(implementation, why) for ``--attn requested``; anything but ``auto`` is returned as asked.
    ``eager_max_seq``: the CPU limits (default :data:`CPU_EAGER_MAX_SEQ`); ``gpu_kind`` and
    ``gpu_eager_max_seq``: the CUDA device's kind and the per-kind limits (default :data:`GPU_EAGER_MAX_SEQ`)."""
    if requested != "auto":
        return requested, f"--attn {requested} as asked"
    if device_type == "cpu":
        limit = (CPU_EAGER_MAX_SEQ if eager_max_seq is None else eager_max_seq).get(precision, 0)
        where = "on CPU"
    elif device_type == "cuda":
        limits = (GPU_EAGER_MAX_SEQ if gpu_eager_max_seq is None else gpu_eager_max_seq).get(gpu_kind or "")
        if limits is None:
            return "sdpa", (f"auto: sdpa, the GPU rule while unmeasured on this GPU ({gpu_kind}): no "
                            "bench_attn_rule artifact of this repository is from one (python "
                            "benchmarks/bench_attn_rule.py on it measures where eager is faster)")
        limit, where = limits.get(precision, 0), f"on {gpu_kind}"
    else:
        return "sdpa", f"auto: sdpa (fused attention on {device_type}: as fast or faster, and smaller)"
    if seq_len <= limit:
        return "eager", (f"auto: eager, measured faster than sdpa {where} at {precision} up to seq {limit} "
                         f"(bench_attn_rule); this run's --seq-len is {seq_len}")
    return "sdpa", (f"auto: sdpa, since --seq-len {seq_len} is beyond seq {limit}, the longest at which eager was "
                    f"measured faster {where} at {precision} (bench_attn_rule; 0 = at no measured length)")


__all__ = ["alibi_from_mask", "attention_mask_for", "CPU_EAGER_MAX_SEQ", "document_causal_mask", "flex_block_mask",
           "GPU_EAGER_MAX_SEQ", "MaskPlan", "pick_attention", "sdpa_mask_plan", "use_mask_positions"]
