"""Defaults chosen by what is trained: ``--lr``, ``--warmup-steps``, the run length and how often it evaluates.

Why one home: a preset's lr (3e-3) wipes out what real weights know, and the mechanics' 60 steps see a thousand rows
of a user's file. Pure functions of what is trained and the data; each value keeps its reason and who gave it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ecomkit.config.vocabulary import AUTO

# What a random-init preset trains with: the chapters' mechanics defaults (lr, warm-up steps, steps).
MECHANICS = {"lr": 3e-3, "warmup_steps": 10, "max_steps": 60, "eval_interval": 20}
PRESET_NLU_FILE_LR = 5e-3      # a random-init preset on a user's NLU file: the demo's lr (ecomkit.train.demo)
LORA_LR = 2e-4                 # real weights + LoRA (peers: 1e-4 .. 3e-4)
WARMUP_SHARE = 0.05            # real weights: linear warm-up over this share of the run's steps
NLU_FILE_GLOBAL_BATCH = 32    # --task nlu on a user's file: rows per step (the demo's 16 × 2 ranks)
NLU_FILE_EPOCHS = 3.0          # --task nlu on a user's file: passes over its examples (HF Trainer's default) ...
NLU_FILE_MIN_STEPS = 600       # ... but at least this many steps (measured: docs/perf.md, "Recipe defaults")
# Measured steps after which a run the epochs rule sized is held against --max-train-minutes.
LENGTH_CHECK_STEPS = 32
# Full fine-tuning's lr by size (full_finetune_lr): (parameters, lr) at two ends, the small one measured here, the
# large one the peers' 2e-5 for SeqGPT-560M (docs/perf.md, "Recipe defaults").
FULL_FT_ANCHORS: tuple[tuple[int, float], tuple[int, float]] = ((356_416, 1e-3), (559_214_592, 2e-5))
FULL_FT_LR_RANGE = (1e-5, 1e-3)   # peers fine-tune 7 B models at 1e-5; above 1e-3 is a from-scratch rate


def full_finetune_lr(n_params: int | None) -> float:
    """The learning rate for fully fine-tuning real weights of ``n_params`` parameters.

    Why by size: the peers' 2e-5 suits 0.5-7 B models but teaches a 2-block model nothing. The lr falls
    log-linearly with Ψ between :data:`FULL_FT_ANCHORS`, within [1e-5, 1e-3], to one significant digit;
    unknown size: 2e-5.
    """
    if not n_params:
        return FULL_FT_ANCHORS[1][1]
    (n_small, lr_small), (n_large, lr_large) = FULL_FT_ANCHORS
    slope = math.log(lr_large / lr_small) / math.log(n_large / n_small)
    lr = min(FULL_FT_LR_RANGE[1], max(FULL_FT_LR_RANGE[0], lr_small * (n_params / n_small) ** slope))
    return float(f"{lr:.0e}")


@dataclass(frozen=True)
class RecipeFacts:
    """What the defaults depend on: the model, the adapters, the task and the data, as the run knows them."""

    model_kind: str             # preset | local | hub (ecomkit.models.bloom.model_origin)
    n_params: int | None        # the model's parameter count (None before it is known)
    peft: str                   # none | lora
    task: str                   # lm | nlu
    user_data: bool             # a file or folder given with --data, not the synthetic catalog
    train_examples: int         # training examples (rows of the task) in one epoch
    steps_per_epoch: int        # optimizer steps that read every training example once

    @property
    def real_weights(self) -> bool:
        return self.model_kind != "preset"


@dataclass
class RecipeValue:
    """One resolved value: what it is, why, and whether the user's flag gave it."""

    value: Any
    reason: str
    given: bool


@dataclass
class Recipe:
    """The resolved ``lr``, ``warmup_steps``, ``max_steps`` (and ``epochs``, ``precision`` where known)."""

    values: dict[str, RecipeValue] = field(default_factory=dict)

    def line(self) -> str:
        """``lr 2e-05 (real weights, full fine-tuning; --lr sets it) | ...``: every value with its reason."""
        return " | ".join(f"{name} {_show(v.value)} ({v.reason})" for name, v in self.values.items())

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: asdict(v) for name, v in self.values.items()}


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def resolve_lr(given: float | str, facts: RecipeFacts) -> RecipeValue:
    """``--lr``: the user's value, else by what is trained."""
    if given != AUTO:
        return RecipeValue(float(given), "--lr given", True)
    if not facts.real_weights and facts.task == "nlu" and facts.user_data:
        return RecipeValue(PRESET_NLU_FILE_LR, "random-init preset on an NLU data file; --lr sets it", False)
    if not facts.real_weights:
        return RecipeValue(MECHANICS["lr"], "random-init preset; --lr sets it", False)
    if facts.peft != "none":
        return RecipeValue(LORA_LR, "real weights, LoRA: peers use 1e-4..3e-4; --lr sets it", False)
    return RecipeValue(full_finetune_lr(facts.n_params),
                       f"real weights, full fine-tuning of {facts.n_params or 0:,} parameters: by size, 2e-5 at 560 M "
                       "(config/recipe.py); --lr sets it", False)


def resolve_run_length(max_steps: int | str, epochs: float, facts: RecipeFacts) -> tuple[RecipeValue, float]:
    """``--max-steps`` (and the epochs it stands for): the user's steps or epochs, else by task and data.
    Returns the steps and the epochs they cover (0 when unknown): ``--task nlu`` on a user's file trains
    ``NLU_FILE_EPOCHS`` passes, at least ``NLU_FILE_MIN_STEPS`` steps; every other run the mechanics' 60."""
    spe = max(1, facts.steps_per_epoch)
    if max_steps != AUTO and int(max_steps) > 0:
        return RecipeValue(int(max_steps), "--max-steps given", True), int(max_steps) / spe
    if epochs > 0:
        steps = max(1, math.ceil(epochs * spe))
        return RecipeValue(steps, f"--epochs {epochs:g} × {spe:,} steps per epoch", True), epochs
    if not length_by_epochs(facts):
        steps = MECHANICS["max_steps"]
        return RecipeValue(steps, "the mechanics default; --max-steps or --epochs sets it", False), steps / spe
    steps = max(NLU_FILE_MIN_STEPS, math.ceil(NLU_FILE_EPOCHS * spe))
    why = (f"{NLU_FILE_EPOCHS:g} epochs of {facts.train_examples:,} examples ({spe:,} steps each), at least "
           f"{NLU_FILE_MIN_STEPS}; --max-steps or --epochs sets it")
    return RecipeValue(steps, why, False), steps / spe


def length_by_epochs(facts: RecipeFacts) -> bool:
    """Whether ``auto`` trains epochs of the data (``--task nlu`` on a user's file), not the mechanics' steps."""
    return facts.task == "nlu" and facts.user_data


def capped_length(total_steps: int, done: int, elapsed_s: float, step_s: float, max_minutes: float,
                  min_steps: int | None = None) -> int | None:
    """The shorter length of a run that would pass ``max_minutes`` at its measured pace, or None when it fits.
    ``done`` steps took ``elapsed_s``, the rest take ``step_s`` each; never below ``min_steps`` (None:
    :data:`NLU_FILE_MIN_STEPS`) nor the steps done. ``max_minutes <= 0``: no cap."""
    if max_minutes <= 0 or step_s <= 0:
        return None
    min_steps = NLU_FILE_MIN_STEPS if min_steps is None else min_steps
    fits = done + int(max(0.0, max_minutes * 60 - elapsed_s) / step_s)
    length = max(min_steps, done, fits)
    return length if length < total_steps else None


def resolve_warmup(given: int | str, total_steps: int, facts: RecipeFacts) -> RecipeValue:
    """``--warmup-steps``: the user's, else 10 for a preset, else ``WARMUP_SHARE`` of the steps for real weights."""
    if given != AUTO:
        return RecipeValue(int(given), "--warmup-steps given", True)
    if not facts.real_weights:
        return RecipeValue(MECHANICS["warmup_steps"], "random-init preset; --warmup-steps sets it", False)
    steps = max(1, round(WARMUP_SHARE * total_steps))
    return RecipeValue(steps, f"{WARMUP_SHARE:.0%} of {total_steps:,} steps for real weights; --warmup-steps sets it",
                       False)


def resolve_global_batch(global_batch_size: int, grad_accum: int, micro_batch_size: int, dp: int, task: str,
                         user_data: bool, length_auto: bool = True) -> RecipeValue:
    """The global batch: ``--global-batch-size`` or ``--grad-accum`` when given, else ``micro × dp``, except
    ``--task nlu`` on a data file whose length the recipe chooses: ``NLU_FILE_GLOBAL_BATCH`` rows by accumulation
    where ``micro × dp`` divides it. A run that sets its length keeps its batch."""
    per_step = micro_batch_size * dp
    if global_batch_size > 0:
        return RecipeValue(global_batch_size, "--global-batch-size given", True)
    if grad_accum != 1:
        return RecipeValue(per_step * grad_accum, "--grad-accum given", True)
    if not (task == "nlu" and user_data and length_auto):
        return RecipeValue(per_step, "micro-batch × data-parallel ranks; --global-batch-size sets it", False)
    if per_step >= NLU_FILE_GLOBAL_BATCH or NLU_FILE_GLOBAL_BATCH % per_step:
        return RecipeValue(per_step, f"micro-batch × ranks ({per_step}) does not divide the {NLU_FILE_GLOBAL_BATCH} "
                                     "that --task nlu on a file trains at; --global-batch-size sets it", False)
    return RecipeValue(NLU_FILE_GLOBAL_BATCH, f"--task nlu on a data file, by {NLU_FILE_GLOBAL_BATCH // per_step} "
                                              "accumulated micro-batches; --global-batch-size sets it", False)


def resolve_eval_interval(given: int | str, steps: RecipeValue, facts: RecipeFacts) -> RecipeValue:
    """``--eval-interval``: the user's, else every ``MECHANICS`` 20 steps, or once an epoch on a run whose
    length the epochs rule chose (every 20 steps of a long run would cost more than its training)."""
    if given != AUTO:
        return RecipeValue(int(given), "--eval-interval given", True)
    if steps.given or not length_by_epochs(facts):
        return RecipeValue(MECHANICS["eval_interval"], "the mechanics default; --eval-interval sets it", False)
    every = max(MECHANICS["eval_interval"], facts.steps_per_epoch)
    return RecipeValue(every, "about once an epoch; --eval-interval sets it", False)


def resolve_recipe(lr: float | str, warmup_steps: int | str, max_steps: int | str, epochs: float,
                   facts: RecipeFacts, eval_interval: int | str = AUTO) -> Recipe:
    """Every value of the recipe from the flags as given (``auto`` or a number) and the run's facts."""
    steps, covered = resolve_run_length(max_steps, epochs, facts)
    recipe = Recipe({"lr": resolve_lr(lr, facts), "warmup_steps": resolve_warmup(warmup_steps, steps.value, facts),
                     "max_steps": steps, "eval_interval": resolve_eval_interval(eval_interval, steps, facts)})
    if covered:
        recipe.values["epochs"] = RecipeValue(round(covered, 2), "passes over the training examples", steps.given)
    return recipe


def mechanics_value(name: str, value: Any) -> Any:
    """``value``, or the mechanics default where it is still ``auto`` (code that builds an optimizer by hand)."""
    return MECHANICS[name] if value == AUTO else value


__all__ = ["LENGTH_CHECK_STEPS", "LORA_LR", "MECHANICS", "NLU_FILE_EPOCHS", "NLU_FILE_GLOBAL_BATCH",
           "NLU_FILE_MIN_STEPS", "PRESET_NLU_FILE_LR", "Recipe", "RecipeFacts", "RecipeValue", "WARMUP_SHARE",
           "capped_length", "full_finetune_lr", "length_by_epochs", "mechanics_value", "resolve_eval_interval",
           "resolve_global_batch", "resolve_lr", "resolve_recipe", "resolve_run_length", "resolve_warmup"]
