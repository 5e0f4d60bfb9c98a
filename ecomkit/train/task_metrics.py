"""Scores of generated answers, and the baselines each score must clear. Pure functions, unit-tested.

Extraction is scored as EcomGPT's released evaluation does: each answer is a *set* of (label, surface text) pairs;
micro-F1 over all pairs, strict accuracy (the predicted set equals the gold set) and per-label F1. Classification:
accuracy and macro-F1; an unparsable answer is wrong. Baselines are learned from the training split only: the
training majority label per label set, and for extraction the dictionary of training spans (:class:`SpanDictionary`).
Garbled answers (U+FFFD, spans not in the input) are counted, not scored differently.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ecomkit.train.evaluate import majority_label

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
