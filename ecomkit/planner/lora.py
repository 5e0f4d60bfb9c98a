"""The memory planner for LoRA and QLoRA: a frozen base, trained low-rank adapters (chapter 03/06).

Why its own rules: the frozen base holds parameters only (bf16 under ``--precision bf16`` on torch strategies; 8 or 4
bits under QLoRA), the adapters hold what full fine-tuning holds for every parameter, activations are paid in full, and
only the adapters' gradients are reduced. The tests hold these bytes to what ``ecomkit.models.lora`` holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ecomkit.config import DEEPSPEED_PLAN_STRATEGIES
from ecomkit.config.schema import BLOOM_LORA_TARGETS
from ecomkit.errors import ConfigError
from ecomkit.planner.loading import load_peak
from ecomkit.planner.memory import MemoryPlan, PlanInput, plan_memory
from ecomkit.planner.shapes import (ModelShape, ParamInfo, deepspeed_partition, fsdp2_shard, local_params,
                                    model_shape, zero3_partition)

# bitsandbytes' bytes per frozen element, scales included (the layouts' figures, not measured).
QUANT_BYTES_PER_PARAM = {8: 1.0, 4: 0.5 + 4 / 64}
LORA_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp2")  # what ecomkit's loop trains LoRA with

# (in_features, out_features) of BLOOM's adaptable Linears, in units of the hidden size.
_LINEAR_SHAPES = {"query_key_value": (1, 3), "dense": (1, 1), "dense_h_to_4h": (1, 4), "dense_4h_to_h": (4, 1)}


@dataclass(frozen=True)
class LoraPlan:
    """The adapters to plan: rank, target modules, and the frozen base's storage (16 = the training dtype)."""

    r: int = 16
    targets: str = BLOOM_LORA_TARGETS
    base_bits: int = 16                  # 16: bf16/fp32 as the precision says; 8 or 4: QLoRA (bitsandbytes)

    def target_names(self) -> list[str]:
        return [t.strip() for t in self.targets.split(",") if t.strip()]


def check_lora_plan(inp: PlanInput, lora: LoraPlan) -> None:
    """One sentence per setup the LoRA path does not have."""
    if lora.r < 1:
        raise ConfigError(f"--lora-r {lora.r}: the adapters' rank must be >= 1 (8 to 64 is typical).")
    unknown = [t for t in lora.target_names() if t not in _LINEAR_SHAPES]
    if unknown or not lora.target_names():
        raise ConfigError(f"LoRA targets {unknown or '(none)'}: the planner knows BLOOM's {', '.join(_LINEAR_SHAPES)}.")
    if lora.base_bits not in (16, 8, 4):
        raise ConfigError(f"--lora-base-bits {lora.base_bits}: 16 (the training dtype), 8 or 4 (QLoRA).")
    if inp.strategy not in LORA_STRATEGIES or inp.tp > 1 or inp.pp > 1:
        raise ConfigError(f"LoRA is planned for {', '.join(LORA_STRATEGIES)} without tp/pp, the strategies "
                          f"ecomkit's loop trains it with (got {inp.strategy}, tp={inp.tp}, pp={inp.pp}).")
    if lora.base_bits < 16 and inp.strategy == "zero3":
        raise ConfigError("QLoRA under ZeRO-3 needs bitsandbytes' quant-storage option that ZeRO-3 can "
                          "partition; the planner covers QLoRA with ddp, zero1/2 and fsdp2.")


def adapter_params(shape: ModelShape, lora: LoraPlan) -> list[ParamInfo]:
    """Every ``lora_A``/``lora_B`` weight, exact shapes, in the weight-decay group (2-D)."""
    out = []
    for layer in range(shape.n_layer):
        for name in lora.target_names():
            fan_in, fan_out = (k * shape.hidden for k in _LINEAR_SHAPES[name])
            out.append(ParamInfo(f"h.{layer}.{name}.lora_A", lora.r * fan_in, lora.r, 0, layer, "rep"))
            out.append(ParamInfo(f"h.{layer}.{name}.lora_B", fan_out * lora.r, fan_out, 0, layer, "rep"))
    return out


def base_bytes_per_param(inp: PlanInput, lora: LoraPlan) -> float:
    """Bytes per frozen base element as the implementation stores it."""
    if lora.base_bits < 16:
        return QUANT_BYTES_PER_PARAM[lora.base_bits]
    if inp.strategy in DEEPSPEED_PLAN_STRATEGIES:
        return 4 if inp.precision == "fp32" else 2
    return 2 if inp.precision == "bf16" else 4


def _is_norm(name: str) -> bool:
    """A BLOOM LayerNorm parameter (``*layernorm*``, ``ln_f``)."""
    return "layernorm" in name or "ln_f" in name


def lora_load_weight_bytes(inp: PlanInput) -> int:
    """Bytes per weight while a LoRA run loads its model: DeepSpeed's training dtype, else the frozen base's dtype."""
    if inp.strategy in DEEPSPEED_PLAN_STRATEGIES:
        return 4 if inp.precision == "fp32" else 2
    return 2 if inp.precision == "bf16" else 4


def lora_state_bytes_of_rank(inp: PlanInput, lora: LoraPlan, base: list[ParamInfo], adapters: list[ParamInfo],
                             rank: int) -> dict[str, Any]:
    """params / grads / optimizer bytes of one data-parallel rank under LoRA, and what offload moves to the CPU."""
    n, s = inp.dp, inp.strategy
    per_base = base_bytes_per_param(inp, lora)
    cpu = {"params": 0, "grads": 0, "optimizer": 0}
    if s in DEEPSPEED_PLAN_STRATEGIES:
        w = 4 if inp.precision == "fp32" else 2
        if s == "zero3":
            part = zero3_partition(adapters, n)
            frozen = per_base * zero3_partition(base, n)
            out = {"params": frozen + w * part, "grads": w * part, "optimizer": 12 * part}
        else:
            part, kept = deepspeed_partition(adapters, n, rank)
            frozen = per_base * sum(p.numel for p in base)
            out = {"params": frozen + w * sum(p.numel for p in adapters), "grads": w * kept, "optimizer": 12 * part}
        if inp.offload_optimizer:
            cpu["optimizer"], out["optimizer"] = out["optimizer"], 0
            cpu["grads"], out["grads"] = 4 * part, 0
    else:
        def held(params: list[ParamInfo]) -> int:
            return sum(p.numel for p in params) if s == "ddp" else fsdp2_shard(params, n, rank)

        # the frozen LayerNorms stay fp32 where the rest of the base is bf16 (models/lora.freeze_base_in_bf16)
        norms = [p for p in base if per_base == 2 and _is_norm(p.name)]
        frozen = per_base * held([p for p in base if p not in norms]) + 4 * held(norms)
        local = held(adapters)
        out = {"params": frozen + 4 * local, "grads": 4 * local, "optimizer": 8 * local}
        if inp.offload_param:
            cpu, out = dict(out), {"params": 0, "grads": 0, "optimizer": 0}
    out = {k: int(math.ceil(v)) for k, v in out.items()}
    out["cpu"] = int(sum(cpu.values()))
    out["cpu_breakdown"] = cpu  # type: ignore[assignment]
    return out


def lora_state_bytes_per_rank(inp: PlanInput, lora: LoraPlan, shape: ModelShape | None = None) -> list[dict]:
    """Every data-parallel rank's LoRA model-state bytes (for tests and plots)."""
    inp = inp.resolved()
    shape = shape or model_shape(inp.model, inp.vocab_size)
    check_lora_plan(inp, lora)
    base, adapters = local_params(shape), adapter_params(shape, lora)
    return [lora_state_bytes_of_rank(inp, lora, base, adapters, r) for r in range(inp.dp)]


def gradient_bytes_per_step(inp: PlanInput, lora: LoraPlan | None, shape: ModelShape | None = None) -> int:
    """Payload of the gradient collectives per optimizer step (one reduction per step): adapters only under LoRA."""
    inp = inp.resolved()
    shape = shape or model_shape(inp.model, inp.vocab_size)
    numel = sum(p.numel for p in adapter_params(shape, lora)) if lora is not None else shape.n_params
    torch_grads = inp.strategy not in DEEPSPEED_PLAN_STRATEGIES   # DDP/FSDP2 reduce fp32 gradients
    return numel * (4 if torch_grads or inp.precision == "fp32" else 2) if inp.dp > 1 else 0


def plan_lora_memory(inp: PlanInput, lora: LoraPlan, shape: ModelShape | None = None) -> MemoryPlan:
    """Full fine-tuning's plan (activations, temporaries, loading) with LoRA's model states, and why."""
    inp = inp.resolved()
    shape = shape or model_shape(inp.model, inp.vocab_size)
    check_lora_plan(inp, lora)
    full = plan_memory(inp, shape)
    base, adapters = local_params(shape), adapter_params(shape, lora)
    ranks = [lora_state_bytes_of_rank(inp, lora, base, adapters, r) for r in range(min(inp.dp, 64))]
    worst = max(ranks, key=lambda d: d["params"] + d["grads"] + d["optimizer"])
    temporary = dict(full.temporary)
    if base_bytes_per_param(inp, lora) < 4:
        temporary["autocast_weights"] = 0   # the base is already 16-bit (or quantised): autocast copies nothing
    trainable = sum(p.numel for p in adapters)
    temporary["comm"] = _lora_comm_buffers(inp, shape, adapters, temporary["comm"], worst["grads"])
    notes = [*full.notes,
             f"LoRA r={lora.r} on {', '.join(lora.target_names())}: {trainable:,} trainable of {shape.n_params:,} "
             f"({trainable / shape.n_params:.2%}); the frozen base has no gradients and no optimizer states",
             "activations are paid in full: backward runs through every frozen block to reach the adapters, so "
             "LoRA saves model states, not activations (use activation checkpointing for those)",
             f"gradients communicated per step: {gradient_bytes_per_step(inp, lora, shape) / 2**20:,.1f} MiB "
             f"(full fine-tuning: {gradient_bytes_per_step(inp, None, shape) / 2**20:,.1f} MiB)"]
    if lora.base_bits < 16:
        notes.append(f"QLoRA: the base's adapted Linears stored in {lora.base_bits} bits by bitsandbytes (the "
                     "layout's bytes per weight, not measured; ecomkit trains it under ddp, ecomkit.models.quant)")
    loading, path = load_peak(inp, shape, base, lora_load_weight_bytes(inp))
    notes = [f"loading the checkpoint: {path}" if n.startswith("loading the checkpoint:") else n for n in notes]
    return replace(full, params=worst["params"], grads=worst["grads"], optimizer=worst["optimizer"],
                   temporary=temporary, cpu_bytes=worst["cpu"], notes=notes, load_bytes=loading, load_path=path)


def _lora_comm_buffers(inp: PlanInput, shape: ModelShape, adapters: list[ParamInfo], full_comm: int,
                       grads_held: int) -> int:
    """Full fine-tuning's communication buffers, with the gradient parts sized by the adapters.

    ZeRO-1/2: the 4.5 × bucket rule over trainable elements; FSDP2: one block's adapters' fp32 gradients; ZeRO-3 and DDP
    keep full fine-tuning's figure.
    """
    w = 4 if inp.precision == "fp32" else 2
    trainable = sum(p.numel for p in adapters)
    if inp.strategy in ("zero1", "zero2"):
        extra = int(4.5 * min(inp.zero_bucket_elements, trainable) * w)
        if inp.strategy == "zero1" and inp.dp > 1:
            extra += max(w * trainable - grads_held, 0)
        return extra
    if inp.strategy == "fsdp2" and inp.dp > 1:
        block_adapters = sum(p.numel for p in adapters if p.layer == 0)
        return full_comm - 4 * shape.block_params(0) + 4 * block_adapters
    return full_comm


def max_lora_micro_batch(inp: PlanInput, lora: LoraPlan, limit: int = 4096) -> int:
    """Largest micro-batch whose LoRA plan fits ``inp.gpu`` (0 if even 1 does not)."""
    inp = inp.resolved()
    shape = model_shape(inp.model, inp.vocab_size)
    fits = lambda b: plan_lora_memory(replace(inp, micro_batch=b), lora, shape).fits  # noqa: E731
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
