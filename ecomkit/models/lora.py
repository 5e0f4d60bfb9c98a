"""LoRA on a frozen base through Hugging Face ``peft``: applied once, between building the model and wrapping it.

Why ``inject_adapter_in_model`` and not ``get_peft_model``: it changes the ``BloomForCausalLM`` in place, so every
strategy keeps the model class it knows; only adapted Linears' names change (``base_layer``, ``lora_A``,
``lora_B``). Adapters are re-initialised from ``cfg.seed`` with PEFT's own reset, so every rank (and a model on the
meta device) starts identical without a broadcast; under ``--precision bf16`` the frozen base is held in bf16 and
the adapters and their optimizer states in fp32.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from ecomkit.config import TrainConfig
from ecomkit.errors import EcomkitError
from ecomkit.models.bloom import build_model, is_local_model_dir
from ecomkit.models.quant import quantize_target_linears

ADAPTER_NAME = "default"                  # PEFT's name for a model's only adapter
ADAPTER_INIT_ATTR = "_ecomkit_adapter_init"  # {parameter name: initial value} for a model built on meta
PEFT_PREFIX = "base_model.model."         # what PeftModel puts before the wrapped model's names


@contextlib.contextmanager
def bitsandbytes_only_for_qlora(cfg: TrainConfig) -> Iterator[None]:
    """Hide bitsandbytes from peft unless ``--lora-base-bits`` asks for it.
    Why: peft imports bitsandbytes whenever installed, and its CPU backend warns in every process of runs that
    quantize nothing; peft's cached answer is cleared on the way in and out."""
    hide = cfg.lora_base_bits >= 16 and "bitsandbytes" not in sys.modules
    if hide:
        sys.modules["bitsandbytes"] = None   # type: ignore[assignment]
    try:
        _clear_peft_bnb_cache()
        yield
    finally:
        if hide and sys.modules.get("bitsandbytes", 0) is None:
            del sys.modules["bitsandbytes"]
        _clear_peft_bnb_cache()


def _clear_peft_bnb_cache() -> None:
    from peft import import_utils  # lazy: as in lora_config (importing it does not import bitsandbytes)

    for name in ("is_bnb_available", "is_bnb_4bit_available"):
        getattr(getattr(import_utils, name, None), "cache_clear", lambda: None)()


def split_names(text: str) -> list[str]:
    """``"a, b,c"`` → ``["a", "b", "c"]`` (the comma-separated config fields)."""
    return [part.strip() for part in text.split(",") if part.strip()]


def lora_config(cfg: TrainConfig) -> Any:
    """``peft.LoraConfig`` for ``cfg`` (task: causal LM, no bias, PEFT's default init)."""
    from peft import LoraConfig  # lazy: peft imports much of transformers' training stack; full runs never need it

    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=split_names(cfg.lora_target_modules),
                      modules_to_save=split_names(cfg.lora_modules_to_save) or None,
                      bias="none", task_type="CAUSAL_LM")


def apply_peft(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Inject LoRA adapters into ``model`` in place and freeze the rest (``cfg.peft == "none"``: unchanged)."""
    if cfg.peft == "none":
        return model
    on_meta = any(p.is_meta for p in model.parameters())
    if cfg.lora_base_bits < 16:   # QLoRA: the Linears LoRA adapts are stored in 8 or 4 bits (ecomkit.models.quant)
        compute = torch.bfloat16 if cfg.precision == "bf16" else torch.float32
        quantize_target_linears(model, cfg.lora_base_bits, split_names(cfg.lora_target_modules), compute)
    with bitsandbytes_only_for_qlora(cfg):
        from peft import inject_adapter_in_model  # lazy: as in lora_config

        inject_adapter_in_model(lora_config(cfg), model, adapter_name=ADAPTER_NAME)
    adapters_in_fp32(model)
    # Re-initialised from cfg.seed in module order with PEFT's own reset, on meta or not: every rank, and a
    # model built on the meta device, start from the same adapter values.
    values = _seeded_adapter_init(model, cfg.seed, on_meta)
    for name, p in model.named_parameters():
        p.requires_grad_(is_trainable_name(name))
    if on_meta:
        setattr(model, ADAPTER_INIT_ATTR, values)
    if cfg.precision == "bf16":
        freeze_base_in_bf16(model)
    return model


def frozen_base_dtype(cfg: TrainConfig) -> torch.dtype | None:
    """bf16 where LoRA holds its frozen base in bf16 (``--precision bf16``; QLoRA: the weights it leaves
    unquantised, and the ones it quantises are read from bf16), else ``None`` (the strategy's own dtype)."""
    return torch.bfloat16 if cfg.peft != "none" and cfg.precision == "bf16" else None


def adapters_in_fp32(model: nn.Module) -> None:
    """Make what LoRA trains fp32: PEFT gives new adapters (and ``modules_to_save`` copies) the base's dtype.
    A model built under ``deepspeed.zero.Init`` is left as is: DeepSpeed keeps its own fp32 masters."""
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        return
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_trainable_name(name) and p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()


def is_trainable_name(name: str) -> bool:
    """A LoRA factor or a module PEFT trains in full (``modules_to_save``); everything else is the frozen base."""
    return ".lora_" in name or f".modules_to_save.{ADAPTER_NAME}." in name


def freeze_base_in_bf16(model: nn.Module) -> None:
    """Cast every frozen floating-point parameter to bf16 (on meta too), but the LayerNorms' (bf16 values held in
    fp32); trainable ones stay fp32.

    Why the norms in fp32: a CPU ``layer_norm`` refuses a ``modules_to_save`` module's fp32 output with bf16 weights.
    """
    norms = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters(recurse=False)}
    with torch.no_grad():
        for p in model.parameters():
            # ZeRO-3 partitions (zero.Init) are left to DeepSpeed, whose bf16 engine casts the whole module
            if not p.requires_grad and p.is_floating_point() and not hasattr(p, "ds_id"):
                p.data = p.data.to(torch.bfloat16)
                if id(p) in norms:
                    p.data = p.data.float()


def _seeded_adapter_init(model: nn.Module, seed: int, on_meta: bool) -> dict[str, torch.Tensor]:
    """PEFT's ``reset_lora_parameters`` on every adapter from one seed; on meta, on CPU copies, values returned."""
    from peft.tuners.lora import LoraLayer  # lazy: as in lora_config

    torch.manual_seed(seed)
    values: dict[str, torch.Tensor] = {}
    for module_name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or ADAPTER_NAME not in module.lora_A:
            continue
        if on_meta:
            for factors in (module.lora_A, module.lora_B):
                factors[ADAPTER_NAME] = factors[ADAPTER_NAME].to_empty(device="cpu")
        module.reset_lora_parameters(ADAPTER_NAME, True)
        if not on_meta:
            continue
        for kind, factors in (("lora_A", module.lora_A), ("lora_B", module.lora_B)):
            for pname, p in factors[ADAPTER_NAME].named_parameters():
                values[f"{module_name}.{kind}.{ADAPTER_NAME}.{pname}"] = p.detach().clone()
            factors[ADAPTER_NAME] = factors[ADAPTER_NAME].to("meta")
    return values


def checkpoint_key(name: str) -> str:
    """The base checkpoint's name for a parameter of an injected model (``x.base_layer.weight`` → ``x.weight``)."""
    return name.replace(".base_layer.", ".").replace(".original_module.", ".")


def trainable_parameter_count(model: nn.Module) -> int:
    """Ψ of the trainable parameters, whole (ZeRO-3 partitions count ``ds_numel``, DTensors their global size)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            total += int(getattr(p, "ds_numel", p.numel()))
    return total


def lora_facts(cfg: TrainConfig, n_trainable: int, n_params: int) -> dict[str, Any] | None:
    """What a LoRA run trains, for its start-up line and summary (None for full fine-tuning)."""
    if cfg.peft == "none":
        return None
    return {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "targets": split_names(cfg.lora_target_modules),
            "modules_to_save": split_names(cfg.lora_modules_to_save), "base_bits": cfg.lora_base_bits,
            "trainable_params": n_trainable, "params": n_params}


def lora_line(facts: dict[str, Any]) -> str:
    """``LoRA r=8 alpha=16 on query_key_value,dense: 16,384 of 372,800 parameters train (4.4%)``."""
    base = "" if facts["base_bits"] >= 16 else f", base in {facts['base_bits']} bits"
    share = facts["trainable_params"] / facts["params"] if facts["params"] else float("nan")
    return (f"LoRA r={facts['r']} alpha={facts['alpha']:g} on {','.join(facts['targets'])}{base}: "
            f"{facts['trainable_params']:,} of {facts['params']:,} parameters train ({share:.2%})")


# ---------------------------------------------------------------------- saving
def peft_model_from_state(state: dict[str, torch.Tensor], model_config: Any, cfg: TrainConfig) -> Any:
    """A plain ``PeftModel`` on CPU holding ``state`` (the consolidated weights of an injected model, fp32)."""
    base = build_model(model_config, seed=None)
    with bitsandbytes_only_for_qlora(cfg), warnings.catch_warnings():
        from peft import get_peft_model  # lazy: as in lora_config

        # peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing` (a FutureWarning per save)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        peft_model = get_peft_model(base, lora_config(cfg), adapter_name=ADAPTER_NAME)
    peft_model.peft_config[ADAPTER_NAME].base_model_name_or_path = base_reference(cfg.model)
    full = {PEFT_PREFIX + k: v.float() for k, v in state.items()}
    missing, unexpected = peft_model.load_state_dict(full, strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embedding
    if missing or unexpected:
        raise EcomkitError(f"Rebuilding the LoRA model from the gathered weights failed: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}. The model was not injected with the same LoraConfig.")
    return peft_model


def base_reference(model: str) -> str:
    """What ``adapter_config.json`` records as the base: a local folder as an absolute path (a relative one
    breaks as soon as the adapter is loaded from another directory), a hub id or a preset name as given."""
    return str(Path(model).resolve()) if is_local_model_dir(model) else model


def save_peft_outputs(state: dict[str, torch.Tensor], model_config: Any, cfg: TrainConfig, out_dir: str | Path,
                      tokenizer: Any | None = None) -> dict[str, str]:
    """Write ``<out_dir>/adapter`` (PEFT's format) and ``<out_dir>/final`` (merged, plain ``save_pretrained``).
    ``adapter`` is what ``PeftModel.from_pretrained(base, dir)`` loads; ``final`` is the base with ``B·A·alpha/r``
    merged in, loadable without peft. Call on the rank that holds the consolidated ``state``."""
    out = Path(out_dir)
    peft_model = peft_model_from_state(state, model_config, cfg)
    peft_model.save_pretrained(str(out / "adapter"), safe_serialization=True)
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(str(out / "final"))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out / "adapter"))
        tokenizer.save_pretrained(str(out / "final"))
    return {"adapter_dir": str((out / "adapter").resolve()), "model_dir": str((out / "final").resolve())}
