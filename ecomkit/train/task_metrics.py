"""Scores of generated answers, the baselines each score must clear, and the run's verdict on them. Pure functions.

Extraction is scored as EcomGPT's released evaluation does: each answer is a *set* of (label, surface text) pairs;
micro-F1 over all pairs, strict accuracy (the predicted set equals the gold set) and per-label F1. Classification:
accuracy and macro-F1; an unparsable answer is wrong. Baselines are learned from the training split only: the
training majority label per label set, and for extraction the dictionary of training spans (:class:`SpanDictionary`).
Garbled answers (U+FFFD, spans not in the input) are counted, not scored differently.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ecomkit.train.nlu_accuracy import majority_label

Span = tuple[str, str]  # (label, surface text): what extraction is scored on


def f1(tp: float, n_pred: float, n_gold: float) -> float:
    """F1 from counts; 0.0 when nothing was predicted or nothing was to be found (no division by zero)."""
    return 2 * tp / (n_pred + n_gold) if n_pred + n_gold else 0.0


def extraction_scores(golds: Sequence[Iterable[Span]], preds: Sequence[Iterable[Span]]) -> dict:
    """Micro precision/recall/F1 over (label, span) sets, strict accuracy and per-label F1 (module docstring)."""
    if len(golds) != len(preds):
        raise ValueError(f"{len(golds)} gold sets but {len(preds)} predicted sets")
    tp = n_pred = n_gold = exact = 0
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # label -> [tp, pred, gold]
    for gold, pred in zip(golds, preds):
        g, p = set(gold), set(pred)
        hit = g & p
        tp, n_pred, n_gold, exact = tp + len(hit), n_pred + len(p), n_gold + len(g), exact + (g == p)
        for label, _ in hit:
            per[label][0] += 1
        for label, _ in p:
            per[label][1] += 1
        for label, _ in g:
            per[label][2] += 1
    n = len(golds)
    return {"precision": tp / n_pred if n_pred else 0.0, "recall": tp / n_gold if n_gold else 0.0,
            "f1": f1(tp, n_pred, n_gold), "strict_acc": exact / n if n else float("nan"),
            "per_label_f1": {label: f1(*per[label]) for label in sorted(per)},
            "tp": tp, "n_pred": n_pred, "n_gold": n_gold, "n": n}


def classification_scores(golds: Sequence[str], preds: Sequence[str | None]) -> dict:
    """Accuracy and macro-F1 (over labels that occur as gold or prediction) of generated labels."""
    if len(golds) != len(preds):
        raise ValueError(f"{len(golds)} gold labels but {len(preds)} predictions")
    n = len(golds)
    correct = sum(g == p for g, p in zip(golds, preds))
    labels = sorted({*golds, *(p for p in preds if p is not None)})
    scores = []
    for label in labels:
        tp = sum(g == p == label for g, p in zip(golds, preds))
        scores.append(f1(tp, sum(p == label for p in preds), sum(g == label for g in golds)))
    return {"acc": correct / n if n else float("nan"),
            "macro_f1": sum(scores) / len(scores) if scores else float("nan"), "n": n}


def training_majorities(label_sets: Mapping[str, Sequence[str]],
                        train_counts: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, ...], str]:
    """``{label set: its training majority label}`` for each classification target's label set (targets sharing
    one label set pool their ``train_counts``)."""
    pooled: dict[tuple[str, ...], Counter] = defaultdict(Counter)
    for target, labels in label_sets.items():
        pooled[tuple(labels)].update(train_counts.get(target, {}))
    return {labels: majority_label(labels, counts) for labels, counts in pooled.items()}


def invalid_text(text: str) -> bool:
    """Whether a generated answer holds U+FFFD: a byte-level token cut in the middle of a UTF-8 character."""
    return "\ufffd" in text


def spans_not_in_text(spans: Iterable[Span], text: str) -> int:
    """How many predicted ``(label, span)`` pairs name a span that is not a substring of the input ``text``."""
    return sum(span not in text for _, span in spans)


@dataclass(frozen=True)
class SpanDictionary:
    """The dictionary baseline: every training span with its most frequent training label."""

    label_of: dict[str, str]

    @classmethod
    def from_spans(cls, spans: Iterable[Span] | Mapping[Span, int]) -> "SpanDictionary":
        """Count (label, span) pairs from training (one per occurrence, or a ``Counter``); a span seen under several
        labels keeps its most frequent one, ties to the label that sorts first (independent of reading order)."""
        pairs = spans.items() if isinstance(spans, Mapping) else ((pair, 1) for pair in spans)
        counts: dict[str, Counter] = defaultdict(Counter)
        for (label, span), n in pairs:
            if span:
                counts[span][label] += n
        return cls({span: min(c, key=lambda lab: (-c[lab], lab)) for span, c in counts.items()})

    def predict(self, text: str, labels: Sequence[str]) -> frozenset[Span]:
        """Dictionary spans found in ``text``: longest first, leftmost, no two overlapping, labels among ``labels``."""
        allowed = set(labels)
        taken = [False] * len(text)
        found: set[Span] = set()
        for span in sorted(self.label_of, key=lambda s: (-len(s), s)):
            label = self.label_of[span]
            if label not in allowed:
                continue
            start = text.find(span)
            while start >= 0:
                if not any(taken[start:start + len(span)]):
                    taken[start:start + len(span)] = [True] * len(span)
                    found.add((label, span))
                start = text.find(span, start + 1)
        return frozenset(found)


def margin_points(score: float, baseline: float) -> float:
    """How far ``score`` is above ``baseline``, in points (×100)."""
    return 100.0 * (score - baseline)


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


def baseline_outcome(summary: Mapping[str, Any], command: Sequence[str] | None = None,
                     recommended_lr: float | None = None) -> dict[str, Any]:
    """The summary's ``baseline`` block: ``cleared`` (None: no figure has a baseline), and when not, what missed,
    why, and the command to retry (``command``: this process's, :func:`launch_command`, when None)."""
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
    retry = retry_command(launch_command() if command is None else command, flags) if flags else None
    line = f"NOT LEARNED: {', '.join(missed)}. Likely: {why}." + (f" Try: {retry}" if retry else "")
    return {"cleared": False, "missed": missed, "reasons": [r.text for r in reasons], "retry": retry, "line": line}
