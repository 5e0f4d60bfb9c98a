"""The run's recipe (``--lr``, ``--warmup-steps``, ``--max-steps`` and ``--precision`` when ``auto``), from its facts.

Why here: the rules are pure (:mod:`ecomkit.config.recipe`); what they need is known only once a run has
its model (preset or real weights, its size), its data (a user's file, how many examples, steps per
epoch) and its precision. This module gathers those facts from a built run, resolves the recipe in
place, and gives the start-up line its words.
"""

from __future__ import annotations

from typing import Any

import torch

from ecomkit.config import TrainConfig
from ecomkit.config.recipe import ESTIMATE_KEY, ESTIMATE_PEAK_SHARE, Recipe, RecipeFacts, RecipeValue, apply_recipe
from ecomkit.envcheck.matmul import run_peak
from ecomkit.models.bloom import flops_per_token, model_origin


def estimate_step_s(tokens_per_step: float, mean_len: float, world_size: int, n_params: int, n_layer: int,
                    hidden: int, device: torch.device, precision: str) -> float | None:
    """One step's wall time, estimated before training: the model FLOPs of one device's share of a step over
    the device's peak times the share of it that runs reached here (``ESTIMATE_PEAK_SHARE``, bench_recipe).

    ``tokens_per_step``: every rank's tokens of one optimizer step; ``mean_len``: the mean training row (the
    attention term). None where no share was measured for the device class (then the length is not bounded).
    """
    share = ESTIMATE_PEAK_SHARE.get(device.type)
    if not share or tokens_per_step <= 0:
        return None
    peak, _ = run_peak(device, precision)
    if not peak:
        return None
    per_device = tokens_per_step / max(1, world_size)
    return per_device * flops_per_token(n_params, n_layer, hidden, mean_len) / (peak * share)


def run_facts(cfg: TrainConfig, n_params: int, n_examples: int, steps_per_epoch: int,
              est_step_s: float | None) -> RecipeFacts:
    """The facts the recipe's rules read, for ``cfg`` and what the run built."""
    return RecipeFacts(model_kind=model_origin(cfg.model)["kind"], n_params=n_params, peft=cfg.peft, task=cfg.task,
                       user_data=cfg.data != "synthetic", train_examples=n_examples,
                       steps_per_epoch=steps_per_epoch, est_step_s=est_step_s)


def resolve_run_recipe(cfg: TrainConfig, facts: RecipeFacts, precision: RecipeValue) -> Recipe:
    """``cfg``'s ``auto`` lr, warm-up and length resolved in place; the recipe with the precision's choice too."""
    recipe = apply_recipe(cfg, facts)
    recipe.values["precision"] = precision
    if facts.est_step_s:   # in summary.json, so a benchmark can hold the estimate against the measured step
        recipe.values[ESTIMATE_KEY] = RecipeValue(
            round(facts.est_step_s, 4), "model FLOPs per step over the device's peak × its measured share", False)
    return recipe


def precision_value(given: str, picked: str, why: str | None) -> RecipeValue:
    """The precision's entry: given by ``--precision``, or ``auto``'s pick and its reason."""
    if given != "auto":
        return RecipeValue(picked, "--precision given", True)
    return RecipeValue(picked, f"auto: {why}; --precision sets it" if why else "auto; --precision sets it", False)


def recipe_summary(recipe: Recipe | None) -> dict[str, Any] | None:
    return recipe.to_dict() if recipe is not None else None


__all__ = ["estimate_step_s", "precision_value", "recipe_summary", "resolve_run_recipe", "run_facts"]
