"""Full fine-tuning beside LoRA under DDP, Accelerate, ZeRO-2/3 (± offload) and FSDP2, measured in one launch.

Each variant (``ddp:full``, ``zero3:lora16``, ``zero3+opt:lora16``, ``fsdp:lora64``, ...) is one run of
the sweep driver (:func:`ecomkit.train.sweep.run_sweep`): same data, same seed, same base model. Two
callbacks measure it:

- chapter 03's :class:`~ecomlab.measure.zero.MemoryProbeCallback`: each rank's parameter, gradient and
  optimizer bytes at the peak of model state (``model_states_per_rank``);
- :class:`LoraProbe`: PEFT's own trainable count beside what each rank trains, a checksum of the rank's
  frozen base before and after training (it must not change), and the bytes of every collective
  the training steps issue, counted by :class:`~ecomkit.parallel.comm_count.CollectiveCounter`
  (chapter 05's way: operators seen at the dispatcher, DDP's C++ reducer included). The gradient
  collectives (all-reduce, reduce-scatter) are reported apart from the parameter all-gathers, since
  LoRA's claim is about gradients: only the adapters' are sent.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ecomkit.config import TrainConfig
from ecomkit.dist import gather_objects
from ecomkit.errors import ConfigError
from ecomkit.models.bloom import build_model
from ecomkit.models.lora import lora_config, trainable_parameter_count
from ecomkit.parallel.comm_count import CollectiveCounter
from ecomkit.train.sweep import run_sweep
from ecomlab.measure.zero import MemoryProbeCallback

GRADIENT_KINDS = ("all_reduce", "reduce_scatter")  # what synchronises gradients; all_gather moves parameters
STRATEGY_WORDS = {"ddp": ("ddp", 0), "accelerate": ("accelerate", 0), "zero0": ("zero", 0), "zero1": ("zero", 1),
                  "zero2": ("zero", 2), "zero3": ("zero", 3), "fsdp": ("fsdp", 0)}


@dataclass(frozen=True)
class LoraVariant:
    """``strategy[+opt]:full|loraR``, e.g. ``zero3+opt:lora16`` (ZeRO-3, optimizer offload, LoRA rank 16)."""

    label: str

    def parts(self) -> tuple[str, int, bool, str, int]:
        """(strategy, zero stage, optimizer offload, peft, rank) named by the label."""
        where, _, what = self.label.partition(":")
        name, _, extra = where.partition("+")
        if name not in STRATEGY_WORDS or extra not in ("", "opt") or not (what == "full" or what.startswith("lora")):
            raise ConfigError(f"Variant '{self.label}': write strategy[+opt]:full|loraR with strategy one of "
                              f"{', '.join(STRATEGY_WORDS)}, e.g. zero3+opt:lora16 or ddp:full.")
        rank = int(what.removeprefix("lora") or 8) if what != "full" else 0
        strategy, stage = STRATEGY_WORDS[name]
        return strategy, stage, extra == "opt", "none" if what == "full" else "lora", rank

    def apply(self, base: TrainConfig) -> TrainConfig:
        cfg = copy.deepcopy(base)
        cfg.strategy, cfg.zero.stage, cfg.zero.offload_optimizer, cfg.peft, r = self.parts()
        if r:
            cfg.lora_r, cfg.lora_alpha = r, 2.0 * r
        return cfg


def parse_variants(text: str) -> list[LoraVariant]:
    """``"ddp:full,ddp:lora16"`` → variants (checked now, before any process group)."""
    variants = [LoraVariant(part.strip()) for part in text.split(",") if part.strip()]
    for v in variants:
        v.parts()
    return variants


# ---------------------------------------------------------------------- what a rank holds
def local_tensor(p: torch.Tensor) -> torch.Tensor:
    """The part of ``p`` this rank stores: a ZeRO-3 partition, a DTensor's local shard, or ``p`` itself."""
    ds = getattr(p, "ds_tensor", None)
    if ds is not None:
        return ds
    return p.to_local() if isinstance(p, DTensor) else p


def frozen_checksum(model: nn.Module) -> str:
    """SHA-256 (16 hex digits) of this rank's frozen parameters, as stored (any dtype)."""
    for module in model.modules():  # FSDP2 leaves the root unit gathered after a forward: hash the shards
        if isinstance(module, FSDPModule):
            module.reshard()
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        if not p.requires_grad:
            t = local_tensor(p).detach().cpu().clone()  # a copy: numpy() on a view pins FSDP2 storage
            h.update(name.encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def peft_trainable_count(model_config: Any, cfg: TrainConfig) -> int:
    """PEFT's own count of trainable parameters for this model and LoraConfig (built on meta: nothing allocated)."""
    from peft import get_peft_model  # lazy: peft imports much of transformers' training stack

    return int(get_peft_model(build_model(model_config, device="meta"), lora_config(cfg)).get_nb_trainable_parameters()[0])


class LoraProbe:
    """Callback: trainable counts, frozen-base checksums, and collective bytes per training step, per rank."""

    def __init__(self) -> None:
        self.counter = CollectiveCounter()
        self.before = ""

    def on_train_start(self, run: Any) -> None:
        strategy = run.strategy
        self.before = frozen_checksum(strategy.raw_model)
        if getattr(strategy, "counter", None) is not None:  # chapter 04's strategy counts every step itself
            return
        context: Callable = strategy.micro_step_context
        step: Callable = strategy.clip_and_step
        counter = self.counter

        def counted_context(is_last: bool):
            stack = contextlib.ExitStack()
            stack.enter_context(context(is_last))
            stack.enter_context(counter)
            return stack

        def counted_step(max_norm: float):
            with counter:
                stats = step(max_norm)
            stats.extra.update(counter.pop_stats().as_dict())
            return stats

        strategy.micro_step_context = counted_context
        strategy.clip_and_step = counted_step

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        model, cfg = run.strategy.raw_model, run.cfg
        save_probe_logits(run)
        rows = [r for r in run.history if r.get("type") == "train" and "comm_by_kind" in r][1:]  # step 1: warm-up
        mine = {
            "trainable_params": trainable_parameter_count(model),
            "trainable_local_elements": sum(local_tensor(p).numel() for p in model.parameters() if p.requires_grad),
            "frozen_checksum_before": self.before, "frozen_checksum_after": frozen_checksum(model),
            "grad_comm_payload_bytes_per_step": _median([_kind_bytes(r, GRADIENT_KINDS) for r in rows]),
            "comm_payload_bytes_per_step": _median([r["comm_payload_bytes"] for r in rows]),
            "comm_wire_bytes_per_step": _median([r["comm_wire_bytes"] for r in rows]),
        }
        summary["lora_probe"] = gather_objects(mine, run.env)
        summary["peft_trainable_params"] = (peft_trainable_count(run.model_config, cfg) if cfg.peft == "lora"
                                            else summary["params"])


PROBE_LOGITS = "in_memory_logits.pt"  # the trained model's logits on fixed tokens, before anything is saved


def probe_tokens(vocab_size: int) -> torch.Tensor:
    """Two fixed rows of 8 token ids, the same for every run (to compare the in-memory and saved models)."""
    return (torch.arange(16).view(2, 8) * 37 + 3) % vocab_size


def save_probe_logits(run: Any) -> None:
    """The in-memory model's logits on :func:`probe_tokens` (a collective under ZeRO-3/FSDP2), written by rank 0."""
    ids = probe_tokens(run.model_config.vocab_size).to(run.env.device)
    with torch.no_grad():
        logits = run.strategy.forward_logits(ids, torch.ones_like(ids))
    if run.env.is_main:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(logits.detach().float().cpu(), run.out_dir / PROBE_LOGITS)


def _kind_bytes(row: dict[str, Any], kinds: Sequence[str]) -> int:
    return sum(v["payload_bytes"] for k, v in row["comm_by_kind"].items() if k in kinds)


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def probe_callbacks(variant: LoraVariant, cfg: TrainConfig) -> list[Any]:
    return [MemoryProbeCallback(), LoraProbe()]


def train_lora_variants(base: TrainConfig, variants: Sequence[LoraVariant]) -> list[dict[str, Any]]:
    """Under torchrun: train every variant in one session (``base.output_dir/<label>``); summaries, every rank."""
    return run_sweep(base, variants, probe_callbacks)


def probe_line(summary: dict[str, Any]) -> str:
    """One printed line per run: trainable params (PEFT's count), gradient bytes per step, base unchanged."""
    probe = summary["lora_probe"]
    unchanged = all(r["frozen_checksum_before"] == r["frozen_checksum_after"] for r in probe)
    grad = probe[0]["grad_comm_payload_bytes_per_step"]
    return (f"peft={summary['peft']} trainable={summary['trainable_params']:,} of {summary['params']:,} "
            f"(peft counts {summary['peft_trainable_params']:,}); gradient collectives "
            f"{grad if grad is None else f'{grad:,.0f}'} B/step on rank 0; frozen base unchanged: {unchanged}")
