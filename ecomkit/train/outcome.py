"""What a run says when its model does not clear its baseline: the figures that missed, the likely reason, and
the user's own command with the flags that address it.

Why: "does NOT clear it" alone leaves a user guessing. Most runs that stay at the baseline do so for a reason the
run already knows: it saw less than one pass over its training rows, its learning rate is far from the one that
suits this kind of model (a random-init preset needs about 3e-3; real weights fine-tuned in full about 2e-5, with
LoRA about 2e-4), or it starts from a random-init preset that knows no language and learns the labels from the
training rows alone. :func:`likely_reasons` decides from the summary's numbers only (a pure function, unit
tested); :func:`baseline_outcome` turns it into one line and a ``baseline`` block for ``summary.json``.

Advice follows the cause: an untrained model's answers run to the generation budget because it has not learned
to end them, and raising ``--gen-max-new-tokens`` does not help it (:func:`ecomkit.train.gen_eval.budget_advice`).
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

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
