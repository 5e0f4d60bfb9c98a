"""What a run keeps and concludes after training: the weights in ``final/``, and whether the model learned.

Why after the loop, in one place: :class:`BestWeights` keeps the weights of the lowest held-out loss when they
beat the last ones by :data:`CLEAR_MARGIN` (not under ZeRO, whose module holds no whole weights), and
:func:`baseline_outcome` says which figures missed the baseline, the likely reason and the flags to change.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

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


# ---------------------------------------------------------------------- the baseline verdict
# Under one pass over the training examples a model has not seen every row once: the first reason to check.
MIN_EPOCHS = 1.0
# The run length a retry asks for when the run saw too little: three passes over the training rows.
RETRY_EPOCHS = 3
# An lr more than this factor away from the one recommended for the model's kind is "far" from it.
LR_FAR_FACTOR = 3.0
# The folder of real weights the README's examples use, suggested when a preset knows no language.
REAL_WEIGHTS_HINT = "./models/SeqGPT-560M"


@dataclass(frozen=True)
class Reason:
    """One likely cause of a missed baseline, and the flags (``--flag``: value, None to drop it) that address it."""

    text: str
    flags: dict[str, str | None]


def missed_baselines(summary: Mapping[str, Any]) -> list[str]:
    """The figures that do not clear their baseline, each with its method and both values."""
    missed = []
    for key in [k for k in summary if k.startswith("acc_")]:
        base = summary.get(f"majority_{key[4:]}")
        if base is not None and summary[key] <= base:
            missed.append(f"{key[4:]} {summary[key]:.3f} ≤ {base:.3f} (candidate scoring)")
    if summary.get("gen_acc_margin_points") is not None and summary["gen_acc_margin_points"] <= 0:
        missed.append(f"generated labels {summary['gen_acc']:.3f} ≤ {summary['gen_majority_acc']:.3f} (generation)")
    if summary.get("gen_span_f1_margin_points") is not None and summary["gen_span_f1_margin_points"] <= 0:
        missed.append(f"generated spans F1 {summary['gen_span_f1']:.3f} ≤ {summary['dict_span_f1']:.3f} (generation)")
    return missed


def has_baselines(summary: Mapping[str, Any]) -> bool:
    """Whether the summary holds a figure with a baseline to clear."""
    return (any(k.startswith("majority_") and not k.startswith("majority_label_") for k in summary)
            or summary.get("gen_acc_margin_points") is not None or summary.get("gen_span_f1_margin_points") is not None)


def likely_reasons(steps: int, steps_per_epoch: float, lr: float, model_kind: str,
                   recommended_lr: float | None = None, peft: str = "none") -> list[Reason]:
    """Why a run likely stayed at its baseline, most likely first (empty: nothing the run can point to).

    ``steps_per_epoch``: optimizer steps in one pass over the training examples; ``model_kind``: ``preset``
    (random init), ``local`` or ``hub`` (real weights, ``models.bloom.model_origin``); ``recommended_lr``: the lr
    the recipe gives this kind of model (``ecomkit.config.recipe``), None when it is not known.
    """
    reasons = []
    if recommended_lr and max(lr / recommended_lr, recommended_lr / lr) > LR_FAR_FACTOR:
        kind = {"preset": "a random-init preset"}.get(model_kind, "real weights" + (" with LoRA" if peft != "none"
                                                                                     else " fine-tuned in full"))
        reasons.append(Reason(f"lr {lr:g} is far from the {recommended_lr:g} recommended for {kind}",
                              {"--lr": f"{recommended_lr:g}"}))
    epochs = steps / steps_per_epoch if steps_per_epoch else float("inf")
    if epochs < MIN_EPOCHS:
        reasons.append(Reason(f"too few steps: {steps} steps saw {epochs:.2f} of one pass over the training rows",
                              {"--max-steps": "0", "--epochs": str(RETRY_EPOCHS)}))
    if model_kind == "preset":
        more = {} if epochs < MIN_EPOCHS else {"--max-steps": "0", "--epochs": str(max(RETRY_EPOCHS,
                                                                                      round(2 * epochs)))}
        reasons.append(Reason("a random-init preset knows no language: it learns the labels from these rows alone "
                              f"(more passes, or real weights: --model {REAL_WEIGHTS_HINT})", more))
    return reasons


def retry_command(command: Sequence[str], flags: Mapping[str, str | None]) -> str:
    """``command`` (an argv) with each ``--flag`` set to its value (replaced where given, appended where not)."""
    out: list[str] = []
    i, seen = 0, set()
    while i < len(command):
        word = command[i]
        name = word.split("=", 1)[0]
        if name in flags:
            seen.add(name)
            takes_value = "=" not in word and i + 1 < len(command) and not command[i + 1].startswith("--")
            i += 2 if takes_value else 1
            if flags[name] is not None:
                out += [name, str(flags[name])]
            continue
        out.append(word)
        i += 1
    for name, value in flags.items():
        if name not in seen and value is not None:
            out += [name, str(value)]
    return shlex.join(out)


def launch_command(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> list[str]:
    """The command that started this process, as a user would type it: torchrun's line under torchrun."""
    argv = list(sys.argv if argv is None else argv)
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" in env or "LOCAL_WORLD_SIZE" in env:
        return ["torchrun", "--standalone", "--nproc_per_node", env.get("LOCAL_WORLD_SIZE", "1"), *argv]
    return ["python", *argv]


def baseline_outcome(summary: Mapping[str, Any], command: Sequence[str],
                     recommended_lr: float | None = None) -> dict[str, Any]:
    """The summary's ``baseline`` block: ``cleared`` (None: no figure has a baseline), and when not, what missed,
    why, and the command to retry."""
    if not has_baselines(summary):
        return {"cleared": None}   # nothing to clear: an LM run, or no classification or extraction figure
    missed = missed_baselines(summary)
    if not missed:
        return {"cleared": True}
    cfg = summary.get("config", {})
    reasons = likely_reasons(int(summary.get("steps", 0)), float(summary.get("steps_per_epoch") or 0),
                             float(cfg.get("lr", 0.0)), (summary.get("model_origin") or {}).get("kind", ""),
                             recommended_lr, cfg.get("peft", "none"))
    flags: dict[str, str | None] = {}
    for r in reasons:
        flags.update(r.flags)
    why = "; ".join(r.text for r in reasons) or "nothing in the run's settings stands out (check the data's labels)"
    retry = retry_command(command, flags) if flags else None
    line = f"NOT LEARNED: {', '.join(missed)}. Likely: {why}." + (f" Try: {retry}" if retry else "")
    return {"cleared": False, "missed": missed, "reasons": [r.text for r in reasons], "retry": retry, "line": line}
