"""Chapter 03's measurement: model-state bytes per rank under ZeRO, sampled during training, beside the formulas.

What each rank holds is counted by the strategy itself (``memory_report``:
:func:`~ecomkit.parallel.zero.state.zero_state_bytes` under DeepSpeed,
:func:`~ecomkit.parallel.state_bytes.model_state_bytes` otherwise);
:class:`MemoryProbeCallback` samples it at the moments of peak model state and
writes ``memory.json``. :func:`memory_row` and :func:`explain_row` put a run's
numbers beside the formulas of :mod:`ecomkit.planner.zero_formulas` and name
every gap. :func:`train_zero_variants` is the chapter's one call: DDP and ZeRO
variants trained in one launch (:func:`ecomkit.train.sweep.run_sweep`), each
with the probe and, when asked, sharded checkpoints.

On GPU the loop's ``peak_mem_bytes`` (``max_memory_allocated``) adds
activations and temporaries on top of the model states counted here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ecomkit.config import StrategyName, TrainConfig
from ecomkit.dist import gather_objects
from ecomkit.metrics import format_bytes
from ecomkit.parallel.zero.checkpoint import ZeroCheckpointCallback, restart_resume_dir
from ecomkit.parallel.zero.config import zero_config_for_launch
from ecomkit.parallel.zero.state import CATEGORIES, largest_layer_params
from ecomkit.parallel.zero.variants import parse_variants
from ecomkit.planner.zero_formulas import (formula_bytes, formula_label, state_bytes_per_element,
                                           zero3_padding_elements)
from ecomkit.train.sweep import AsConfigured, Variant, run_sweep
from ecomlab.measure.run_comparisons import max_relative_loss_difference


# ---------------------------------------------------------------------- the probe callback
class MemoryProbeCallback:
    """Counts model-state bytes just before each optimizer step, for any strategy; gathers them per rank.

    Before the step is when gradients are still alive and (from step 2 on)
    optimizer states exist, so it is the moment of peak *resident* model
    state (after each backward too, which catches ZeRO-1's full gradients
    between accumulation micro-steps). A separate count is taken inside the
    torch optimizer's ``step()`` (a step pre-hook), where DeepSpeed holds
    transient fp32 copies of the gradient partition: DeepSpeed's estimators
    include those, the paper's formulas do not. The largest snapshots are
    kept. At the end every rank's numbers go into the summary
    (``model_states_per_rank``), and rank 0 writes them to ``memory.json``
    with the run's Ψ and world size when ``out_path`` is given.
    """

    def __init__(self, out_path: str | None = None):
        self.out_path = out_path
        self.best: dict[str, Any] = {}      # resident model states (after backward / before the step)
        self.in_step: dict[str, Any] = {}   # the largest count taken inside the torch optimizer's step()
        self.per_rank: list[dict[str, Any]] = []

    def on_train_start(self, run: Any) -> None:
        strategy = run.strategy
        step: Callable = strategy.clip_and_step
        backward: Callable = strategy.backward

        def probed_step(max_norm: float):
            self._sample(strategy, "before optimizer step")
            return step(max_norm)

        def probed_backward(loss):
            out = backward(loss)
            self._sample(strategy, "after backward")  # catches stage 1's full gradients between micro-steps
            return out

        strategy.clip_and_step = probed_step
        strategy.backward = probed_backward
        base = getattr(strategy.optimizer, "optimizer", strategy.optimizer)  # DeepSpeed wraps a torch optimizer
        if isinstance(base, torch.optim.Optimizer):
            base.register_step_pre_hook(lambda *_: self._sample_in_step(strategy))

    def _sample(self, strategy: Any, moment: str) -> None:
        snap = strategy.memory_report()
        if snap.get("total", 0) >= self.best.get("total", -1):
            self.best = {**snap, "moment": moment}

    def _sample_in_step(self, strategy: Any) -> None:
        """Inside the optimizer step DeepSpeed holds transient fp32 copies of the gradient partition."""
        snap = strategy.memory_report()
        if snap.get("total", 0) >= self.in_step.get("total", -1):
            self.in_step = snap

    def on_train_end(self, run: Any, summary: dict[str, Any]) -> None:
        mine = {**self.best, "in_step": {k: v for k, v in self.in_step.items() if k != "breakdown"},
                "in_step_breakdown": self.in_step.get("breakdown", {})}
        self.per_rank = gathered = gather_objects(mine, run.env)
        summary["model_state_bytes_per_rank"] = [g.get("total") for g in gathered]
        summary["model_states_per_rank"] = [{k: int(g.get(k, 0)) for k in ("params", "grads", "optimizer", "total")}
                                            for g in gathered]
        if run.env.is_main and self.out_path:
            is_zero = run.cfg.strategy == StrategyName.ZERO
            report = {"strategy": run.strategy.name, "stage": run.cfg.zero.stage if is_zero else 0,
                      "world_size": run.env.world_size, "psi": run.n_params, "precision": run.cfg.precision,
                      "per_rank": gathered,
                      "offload_optimizer": run.cfg.zero.offload_optimizer and is_zero,
                      "offload_param": run.cfg.zero.offload_param and is_zero,
                      "largest_layer": largest_layer_params(run.strategy.raw_model),
                      "param_numels": [getattr(p, "ds_numel", p.numel()) for p in run.strategy.raw_model.parameters()]}
            Path(self.out_path).parent.mkdir(parents=True, exist_ok=True)
            Path(self.out_path).write_text(json.dumps(report, indent=2))


# ---------------------------------------------------------------------- chapter 03's runs
def zero_run_callbacks(variant: Any, cfg: TrainConfig) -> list[Any]:
    """The memory probe (``memory.json``) and, when asked, sharded ZeRO checkpoints / resume: from
    ``--zero-resume-from``, or after torchrun restarted the workers, from this run's own newest checkpoint."""
    out = Path(cfg.output_dir)
    callbacks: list[Any] = [MemoryProbeCallback(str(out / "memory.json"))]
    if cfg.strategy == StrategyName.ZERO and (cfg.zero.checkpoint_interval or cfg.zero.resume_from):
        ckpt_dir = cfg.zero.checkpoint_dir or str(out / "checkpoints")
        resume = cfg.zero.resume_from or restart_resume_dir(ckpt_dir, cfg.fault.resume)
        callbacks.append(ZeroCheckpointCallback(ckpt_dir, cfg.zero.checkpoint_interval, resume))
    return callbacks


def train_zero_variants(cfg: TrainConfig, stages: str | None = None) -> list[dict[str, Any]]:
    """Chapter 03 in one call: ``cfg`` as configured, or every ``--stages`` variant (``ddp,1,2,3,3+opt``) in turn.

    Each ZeRO variant's DeepSpeed config is generated first, so a bad
    ``--zero-user-config`` fails before any process group exists. With
    ``stages`` every variant writes into ``cfg.output_dir/<variant>``.
    """
    variants: Sequence[Variant] = parse_variants(stages) if stages else [AsConfigured()]
    for variant in variants:
        v_cfg = variant.apply(cfg)
        if v_cfg.strategy == StrategyName.ZERO:
            zero_config_for_launch(v_cfg)
    return run_sweep(cfg, variants, zero_run_callbacks, subdirs=bool(stages))


def model_states_line(summary: dict[str, Any]) -> str:
    """One line for a run's summary: the model-state bytes each rank held, and where the details are."""
    per_rank = ", ".join(format_bytes(r["total"]) for r in summary.get("model_states_per_rank", []))
    where = Path(summary["output_dir"]) / "memory.json"
    return f"model states    {per_rank} per rank (params + grads + optimizer; details in {where})"


# ---------------------------------------------------------------------- comparison tables
# Stated tolerances of "ZeRO trains what DDP trains" (relative, per logged step). fp32: only the reduction
# order differs (observed ~1e-8). Optimizer offload: DeepSpeedCPUAdam's own arithmetic (~1e-6). bf16:
# DeepSpeed keeps bf16 weights while DDP keeps fp32 weights under autocast (observed ~1e-4).
LOSS_TOLERANCE = {"fp32": 1e-6, "offload": 1e-5, "bf16": 1e-2, "fp16": 1e-2}
SCALAR_BYTES = 1024   # Adam step counters, grad-norm and overflow trackers: a few scalars per rank


def loss_tolerance(variant: str) -> float:
    """The tolerance for a ``--stages`` label: ``3`` → fp32, ``2+opt`` → offload, ``3@bf16`` → bf16."""
    if "@" in variant and variant.rsplit("@", 1)[1] in ("bf16", "fp16"):
        return LOSS_TOLERANCE[variant.rsplit("@", 1)[1]]
    return LOSS_TOLERANCE["offload" if "+opt" in variant else "fp32"]


def loss_agreement(metrics: dict[str, Sequence[dict[str, Any]]], reference: str = "ddp") -> list[dict[str, Any]]:
    """Each variant's largest relative loss difference to ``reference``, beside its stated tolerance."""
    rows = []
    for variant, rows_ in metrics.items():
        if variant == reference:
            continue
        diff, tol = max_relative_loss_difference(rows_, metrics[reference]), loss_tolerance(variant)
        rows.append({"variant": variant, "max_rel_diff": diff, "tolerance": tol, "ok": diff <= tol})
    return rows


def formula_check(row: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """Does the measured model-state total (params + grads + optimizer, largest rank) equal the formula?

    Expected: the precision-matched formula, plus what the formula leaves out
    by construction, each bounded and named:

    - ZeRO-3 pads every parameter to ``ceil(numel / N)`` elements per rank
      (:func:`~ecomkit.planner.zero_formulas.zero3_padding_elements`);
    - ZeRO-2 (and offloaded ZeRO-1/2) keep the whole gradient of a parameter
      that straddles the partition boundary: at most the largest parameter's
      gradient on top of the formula;
    - a few scalars (``SCALAR_BYTES``).

    ``ok`` when the measurement lies in ``[low, high]``.
    """
    formula, per_elem = row["formula"]["total"], state_bytes_per_element(row["strategy"], row["precision"])
    elem_bytes = 2 * per_elem["param_bytes"] + per_elem["master_bytes"] + per_elem["adam_bytes"]  # grads = params
    padding = (zero3_padding_elements(report["param_numels"], row["world_size"]) * elem_bytes
               if row["stage"] == 3 else 0.0)
    straddle = (max(report["param_numels"]) * per_elem["param_bytes"]
                if row["stage"] == 2 or (row["stage"] == 1 and row["offload"]) else 0.0)
    measured = row["measured"]["params"] + row["measured"]["grads"] + row["measured"]["optimizer"]
    low, high = formula + padding - SCALAR_BYTES, formula + padding + straddle + SCALAR_BYTES
    return {"label": row["label"], "measured": measured, "formula": formula, "padding": padding,
            "straddle_allowance": straddle, "low": low, "high": high, "ok": low <= measured <= high,
            "ratio": measured / formula}


def memory_row(report: dict[str, Any], label: str) -> dict[str, Any]:
    """One variant's measured bytes (largest rank) beside its precision-matched formula and the paper's."""
    ranks = report["per_rank"]
    measured = {c: max(r.get(c, 0) for r in ranks) for c in (*CATEGORIES, "total")}
    stage, n, psi = report["stage"], report["world_size"], report["psi"]
    per_elem = state_bytes_per_element(report["strategy"], report["precision"])
    formula = formula_bytes(stage, psi, n, **per_elem)
    return {"label": label, "strategy": report["strategy"], "stage": stage, "world_size": n, "psi": psi,
            "precision": report["precision"], "offload": bool(report.get("offload_optimizer")),
            "measured": measured, "formula": formula, "paper": formula_bytes(stage, psi, n),
            "formula_label": formula_label(stage, **per_elem), "ratio": measured["total"] / formula["total"],
            "breakdown": ranks[0].get("breakdown", {}), "moment": ranks[0].get("moment"),
            "in_step_total": max(r.get("in_step", {}).get("total", 0) for r in ranks),
            "in_step_breakdown": ranks[0].get("in_step_breakdown", {}),
            "largest_layer": report.get("largest_layer", 0)}


def explain_row(row: dict[str, Any]) -> list[str]:
    """Name the cause of every gap between the measured bytes and the formula, with the bytes involved."""
    notes: list[str] = []
    m, f = row["measured"], row["formula"]
    if row["strategy"] == "zero" and row["precision"] == "fp32":
        notes.append("fp32 training: 4-byte params and grads, and DeepSpeed still keeps a cloned fp32 master "
                     "partition (4 bytes/param) next to the weights, so its totals are 20Ψ-based, not 16Ψ.")
    if row["strategy"] == "ddp":
        notes.append("torch DDP keeps fp32 weights (autocast only computes in bf16) and AdamW's two moments: "
                     "4+4+8 = 16 bytes/param whatever --precision says; no separate master copy.")
    if m["buffers"]:
        notes.append(f"{m['buffers']:,} B of communication buckets (reduce/all-gather buffers sized by "
                     "reduce_bucket_size, capped at Ψ here; allocated up front, not part of any formula)"
                     + (". Stage 1/2 with overlap_comm keep two of them." if row["stage"] in (1, 2) else "."))
    extra_grads = int(m["grads"] - f["grads"])
    if row["stage"] in (1, 2) and extra_grads > 0.01 * f["grads"]:
        if row["offload"]:
            notes.append(f"+{extra_grads:,} B of gradients: with optimizer offload ZeRO-1/2 keep an fp32 copy of the "
                         "gradient partition for the CPU optimizer plus staging buffers for the copy.")
        else:
            notes.append(f"+{extra_grads:,} B of gradients: the contiguous gradient buffer holds the WHOLE gradient of "
                         "every parameter that touches this rank's partition, so a parameter straddling the partition "
                         "boundary (here the embedding, the largest tensor) is held in full by both ranks.")
    if row["stage"] == 1 and m["grads"] >= 0.99 * row["paper"]["grads"] * (2 if row["precision"] == "fp32" else 1):
        notes.append(f"stage 1 keeps full gradients between micro-steps (measured {row['moment']}): only the "
                     "optimizer states are partitioned.")
    if row["stage"] == 3 and row["offload"] and extra_grads > 0:
        notes.append(f"+{extra_grads:,} B: with optimizer offload ZeRO-3 keeps an fp32 gradient partition for the "
                     "CPU optimizer.")
    transient = int(row.get("in_step_total", 0) - m["total"])
    if row["strategy"] == "zero" and transient > 0.01 * m["total"]:
        notes.append(f"inside step() the rank briefly holds {transient:+,} B more: an fp32 copy of the gradient "
                     "partition, made for the optimizer one parameter group at a time. DeepSpeed's estimators count "
                     "such a copy, the formulas do not.")
    small = int(round(m["total"] - f["total"] - (extra_grads if extra_grads > 0.01 * f["grads"] else 0)))
    if 0 < abs(small) < 1024:
        notes.append(f"{small:+,} B: scalars (Adam step counters, the grad-norm and overflow trackers).")
    return notes


__all__ = ["MemoryProbeCallback", "zero_run_callbacks", "train_zero_variants", "model_states_line",
           "max_relative_loss_difference", "loss_tolerance", "loss_agreement", "formula_check", "memory_row",
           "explain_row"]
