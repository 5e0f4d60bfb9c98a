"""What a run keeps after training: the weights in ``final/``, the best evaluated ones or the last, and why.

Why: the copy of the lowest held-out loss replaces the last weights only when lower by more than :data:`CLEAR_MARGIN`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ecomkit.train.evaluate import held_out_loss

METRIC = "eval_loss"
# An earlier copy replaces the last weights only when its loss is lower by more than this share: within 1 % is a
# sample's noise, and the last weights have seen the most data.
CLEAR_MARGIN = 0.01
# Strategies whose module parameters are the whole model on every rank and are what final/ is saved from.
COPYABLE = ("single", "ddp")


def why_last(eval_interval: int, strategy_name: str, replicated: bool) -> str | None:
    """Why this run keeps its last weights (None: it keeps the best evaluated ones)."""
    if not eval_interval:
        return "no periodic evaluation (--eval-interval 0), so nothing to compare the last step with"
    if strategy_name not in COPYABLE or not replicated:
        return (f"strategy {strategy_name} saves weights its module does not hold whole (a shard per rank, or "
                "ZeRO's fp32 master copy); a best copy would need a gather per evaluation")
    return None


# ---------------------------------------------------------------------- the weights kept
class BestWeights:
    """One host copy of the trainable parameters at the lowest held-out loss seen so far."""

    def __init__(self, model: torch.nn.Module | None, reason: str | None):
        self.model, self.reason = model, reason
        self.step: int | None = None
        self.value = math.inf
        self.evaluations = 0
        self.copy: dict[str, torch.Tensor] | None = None

    @classmethod
    def for_run(cls, run: Any) -> "BestWeights":
        reason = why_last(run.cfg.eval_interval, run.strategy.name, getattr(run.strategy, "replicated", False))
        return cls(run.strategy.raw_model if reason is None else None, reason)

    def observe(self, step: int, row: dict[str, Any]) -> dict[str, Any]:
        """A periodic evaluation's row: keep a copy when its loss is the lowest so far; returns the row."""
        value = row.get(METRIC)
        if self.reason is not None or value is None or math.isnan(value):
            return row
        self.evaluations += 1
        if value < self.value:
            self.step, self.value = step, float(value)
            self.copy = {n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters()
                         if p.requires_grad}
        return row

    @torch.no_grad()
    def restore(self) -> None:
        params = dict(self.model.named_parameters())
        for name, saved in self.copy.items():
            params[name].copy_(saved.to(params[name].device))

    def finish(self, last_step: int, last_value: float | None) -> dict[str, Any]:
        """:meth:`decide`, with the summary's printed ``line``."""
        block = self.decide(last_step, last_value)
        return {**block, "line": checkpoint_line(block)}

    def decide(self, last_step: int, last_value: float | None) -> dict[str, Any]:
        """Put the best copy back when it beats the last weights (``last_value``: their loss on the same sample);
        return the summary's ``final_checkpoint`` block."""
        if self.reason is not None or self.copy is None:
            return {"kept": "last", "step": last_step, "metric": METRIC,
                    "reason": self.reason or "no periodic evaluation measured a held-out loss"}
        block = {"metric": METRIC, "evaluations": self.evaluations + 1, "last_step": last_step,
                 "last_value": last_value}
        if last_value is not None and not math.isnan(last_value) and self.value >= last_value * (1 - CLEAR_MARGIN):
            self.copy = None
            return {"kept": "last", "step": last_step, "value": last_value, **block,
                    "reason": f"no earlier evaluation's held-out loss is lower by more than {CLEAR_MARGIN:.0%} "
                              f"(best: step {self.step}, {self.value:.4f})"}
        self.restore()
        self.copy = None
        return {"kept": "best", "step": self.step, "value": self.value, **block,
                "reason": f"its held-out loss is lower than the last step's ({last_value:.4f})"}


def checkpoint_line(kept: dict[str, Any]) -> str:
    """The summary's line: which weights the run kept (and evaluated), at which step, and why."""
    value = f", {kept['metric']} {kept['value']:.4f} on the periodic sample" if kept.get("value") is not None else ""
    which = "the best evaluation's" if kept["kept"] == "best" else "the last step's"
    return f"kept weights    {which}, step {kept['step']}{value}: {kept['reason']}\n"


def keep_best_or_last(run: Any, best: BestWeights) -> dict[str, Any]:
    """At the end of training, before the final evaluation: the last weights' loss on the periodic sample (a
    collective; only when an earlier copy exists), then :meth:`BestWeights.finish`."""
    last_value = None
    if best.copy is not None and best.step != run.step:
        cfg = run.cfg
        last_value = held_out_loss(run.strategy, run.eval_ds, run.collate, run.env, cfg.micro_batch_size,
                                   cfg.eval_batches, run.shard)[METRIC]
    elif best.copy is not None:
        last_value = best.value
    return best.finish(run.step, last_value)
