"""Chapter 06: the model-state bytes each rank holds under DDP, ZeRO-1/2/3 and FSDP2, beside the planner's.

Each strategy is one variant of the sweep driver (:func:`ecomkit.train.sweep.run_sweep`):
the tiny BLOOM trains a couple of optimizer steps through the training loop
of chapter 02, with chapter 03's :class:`~ecomlab.measure.zero.MemoryProbeCallback`
counting each rank's parameter, gradient and optimizer bytes at the moment
of peak model state (just before the last optimizer step). The count is the
strategies' own ``memory_report`` (DeepSpeed-aware for ZeRO,
:func:`~ecomkit.parallel.state_bytes.model_state_bytes` for the others), so
the numbers are what chapter 03/04 runs report in their ``memory.json`` /
``parallel_layout.json``. :func:`compare_states_with_plan` adds the planner's
bytes for the same model, strategy, world size and rank.

The vocabulary is the tokenizer's (the catalog BPE has an odd size, 4003), so
FSDP2's uneven shards and DeepSpeed's alignment padding are exercised.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

from ecomkit.config import TrainConfig, parse_plan_strategy
from ecomkit.models.tokenizer import get_tokenizer, local_tokenizer_dir
from ecomkit.planner.memory import PlanInput, model_state_bytes_per_rank
from ecomkit.train.loop import tokenizer_cache_dir
from ecomkit.train.sweep import run_sweep
from ecomlab.measure.zero import MemoryProbeCallback

STATE_STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp2")


@dataclass(frozen=True)
class PlannerStrategy:
    """A planner strategy name (``zero2``, ``fsdp2``) as a sweep variant: the training strategy and stage it names."""

    label: str

    def apply(self, base: TrainConfig) -> TrainConfig:
        cfg = copy.deepcopy(base)
        strategy, stage = parse_plan_strategy(self.label)
        cfg.strategy, cfg.zero.stage = strategy.value, stage
        return cfg


def states_config(precision: str = "fp32", steps: int = 2, output_dir: str = "runs/06_states") -> TrainConfig:
    """The measured job: tiny BLOOM, micro-batch 2 × 32 tokens, no accumulation, ``steps`` optimizer steps."""
    return TrainConfig(model="tiny", precision=precision, output_dir=output_dir, progress=False, save_model=False,
                       max_steps=steps, warmup_steps=1, micro_batch_size=2, grad_accum=1, seq_len=32, n_rows=200,
                       eval_interval=0, eval_batches=1)


def probe_callbacks(variant: PlannerStrategy, cfg: TrainConfig) -> list[Any]:
    """Only the memory probe: the counts go into each summary (``model_states_per_rank``), no file needed."""
    return [MemoryProbeCallback()]


def measure_strategy_states(strategies: Sequence[str] = STATE_STRATEGIES, precision: str = "fp32", steps: int = 2,
                            output_dir: str = "runs/06_states", vocab_size: int | None = None
                            ) -> list[dict[str, Any]]:
    """Under torchrun: one row per strategy and rank (params, grads, optimizer bytes), on every rank.

    Each strategy trains in ``output_dir/<strategy>`` inside one process-group session.
    ``vocab_size``: size the model by a local BPE with this target vocabulary
    instead of the default one (every rank may call this at once: the cache
    is written atomically).
    """
    base = states_config(precision, steps, output_dir)
    if vocab_size is not None:
        base.tokenizer = str(local_tokenizer_dir(tokenizer_cache_dir(), vocab_size))
    variants = [PlannerStrategy(name) for name in strategies]
    summaries = run_sweep(base, variants, probe_callbacks)
    vocab_size = len(get_tokenizer(base.tokenizer, tokenizer_cache_dir()))  # what the loop sized the model by
    rows = []
    for variant, summary in zip(variants, summaries):
        for rank, held in enumerate(summary["model_states_per_rank"]):
            rows.append({"strategy": variant.label, "rank": rank, "world_size": summary["world_size"],
                         "precision": precision, "psi": summary["params"], "vocab_size": vocab_size,
                         **{k: held[k] for k in ("params", "grads", "optimizer")}})
    return rows


def compare_states_with_plan(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add the planner's per-rank bytes (same model, vocabulary, strategy, world size, rank) to measured rows."""
    out = []
    for r in rows:
        plan = model_state_bytes_per_rank(PlanInput(model="tiny", vocab_size=r["vocab_size"], world_size=r["world_size"],
                                                    strategy=r["strategy"], precision=r["precision"], device="cpu"),
                                          after_reduce=True)   # the probe counts at the optimizer step
        mine = plan[r["rank"]]
        row = dict(r)
        for k in ("params", "grads", "optimizer"):
            row[f"planned_{k}"] = mine[k]
        row["measured_total"] = r["params"] + r["grads"] + r["optimizer"]
        row["planned_total"] = mine["params"] + mine["grads"] + mine["optimizer"]
        row["difference_bytes"] = row["measured_total"] - row["planned_total"]
        out.append(row)
    return out
