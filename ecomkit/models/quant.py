"""QLoRA's frozen base: the LoRA target Linears stored in 4 bits (NF4) or 8 bits (LLM.int8) by bitsandbytes.

Swapped in after the build, so presets built from a config get the same layers transformers' loader creates.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

QUANT_BITS = (8, 4)


def _bnb() -> Any:
    import bitsandbytes  # lazy: optional extra (pip install ecomkit[qlora]); only QLoRA runs need it

    return bitsandbytes


def quantize_target_linears(model: nn.Module, bits: int, targets: list[str], compute_dtype: torch.dtype) -> int:
    """Replace each ``nn.Linear`` named in ``targets`` by its frozen bitsandbytes twin; returns how many."""
    bnb = _bnb()
    replaced = 0
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or name.rsplit(".", 1)[-1] not in targets:
            continue
        has_bias = module.bias is not None
        if bits == 4:
            q = bnb.nn.Linear4bit(module.in_features, module.out_features, bias=has_bias, quant_type="nf4",
                                  compute_dtype=compute_dtype)
            # bitsandbytes repacks for AVX512-BF16 at the first eval forward, after which training forwards fail.
            q.support_avx512bf16_for_cpu = False
        else:
            q = bnb.nn.Linear8bitLt(module.in_features, module.out_features, bias=has_bias, has_fp16_weights=False,
                                    threshold=6.0)
        q.load_state_dict(module.state_dict())
        q = q.to(module.weight.device)            # bitsandbytes quantizes the weight on this move
        for p in q.parameters():
            p.requires_grad_(False)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, q)
        replaced += 1
    return replaced


def is_quantized_linear(module: nn.Module) -> bool:
    bnb = _bnb()
    return isinstance(module, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))


def dequantized_weight(module: nn.Module) -> torch.Tensor:
    """The fp32 weight a bitsandbytes Linear computes with."""
    bnb = _bnb()
    w = module.weight
    if isinstance(module, bnb.nn.Linear4bit):
        return bnb.functional.dequantize_4bit(w.data, w.quant_state).float()
    scb = w.SCB if getattr(w, "SCB", None) is not None else module.state.SCB   # moved to .state after a forward
    return w.data.float() * scb.float().unsqueeze(1) / 127.0


def has_quantized_base(model: nn.Module) -> bool:
    return any(type(m).__module__.startswith("bitsandbytes") for m in model.modules())


def dequantized_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` in fp32 with each bitsandbytes weight dequantized and its quantization state left out."""
    quantized = {name: m for name, m in model.named_modules() if type(m).__module__.startswith("bitsandbytes")}
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        owner, _, leaf = key.rpartition(".")
        if any(key.startswith(f"{name}.weight") for name in quantized) and owner not in quantized:
            continue                               # weight.absmax, weight.quant_map, ...: the quantization state
        if owner in quantized and leaf == "weight":
            value = dequantized_weight(quantized[owner])
        elif owner in quantized and leaf not in ("bias",):
            continue                               # SCB, weight_format: int8 state
        out[key] = value.detach().float().cpu()
    return out
