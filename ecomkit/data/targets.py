"""Task nlu's targets: what each target (category, sentiment, extraction, brand) asks of a record.

Training, evaluation and ``ecomkit.predict`` read the same input of a row for the same target; an lm run loads none of
this (``data.tasks`` imports it by name, ``TARGETS``).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
from datasets import Dataset

from ecomkit.data.catalog import spans_from_json
from ecomkit.data.formats import KIND_CLASSIFY, KIND_EXTRACT, TaskExample, build_prompt, prompt_and_answer
from ecomkit.data.stream import read_columns
from ecomkit.data.task_file import check_format
from ecomkit.data.tasks import (BRAND_LABEL, BUILTIN_LABELS, CATEGORY_LABELS, CLASSIFICATION_TASKS, SENTIMENT_LABELS,
                                NluExample, build_nlu_examples, category_prompt, first_present, sentiment_prompt)
from ecomkit.errors import ConfigError, DataError


@dataclass(frozen=True)
class ClassificationExample:
    """A prompt, its candidate answers, and which one is correct (for accuracy by scoring)."""

    task: str
    prompt: str
    candidates: tuple[str, ...]
    correct_index: int


def build_classification_example(record: Mapping[str, Any], task: str, labels: Sequence[str] | None = None,
                                 prompt_format: str = "ecomkit") -> ClassificationExample:
    """Prompt, candidates and correct index for ``task`` in ``("category", "sentiment")``.

    Pass the whole data set's labels (``BuildReport.labels[task]``) so training prompts and candidates agree.
    """
    if task == "category":
        labels = tuple(labels or CATEGORY_LABELS)
        prompt, gold = category_prompt(record, labels), record.get("category")
    elif task == "sentiment":
        labels = tuple(labels or SENTIMENT_LABELS)
        prompt, gold = sentiment_prompt(record, labels), record.get("sentiment")
    else:
        raise ConfigError(f"Unknown classification task {task!r}; use one of {CLASSIFICATION_TASKS}.")
    if prompt_format != "ecomkit":
        found = first_present(record, ("title", "review", "text") if task == "category" else ("review", "text"))
        prompt = build_prompt(prompt_format, KIND_CLASSIFY, found[1] if found else "", labels)
    if gold not in labels:
        raise DataError(f"Record {record.get('sku') or ''!s} has {task}={gold!r}, which is not among the candidate "
                        f"labels {list(labels)}. Pass the labels of the whole data set (labels_from_values, or "
                        f"category_labels_for(all_records)), or drop records without a {task}.")
    return ClassificationExample(task, prompt, labels, labels.index(gold))


def nlu_examples(record: Mapping[str, Any], labels: Mapping[str, Sequence[str]],
                 prompt_format: str) -> list[NluExample]:
    """Task nlu's prompt/answer pairs of a record that is not an instruction pair, in ``prompt_format``."""
    check_format(prompt_format)
    if prompt_format == "ecomkit":
        legacy = build_nlu_examples(record, labels.get("category", CATEGORY_LABELS),
                                    labels.get("sentiment", SENTIMENT_LABELS))
        extract = [(k, ex) for k, ex in record_task_examples(record, labels) if k == "extract"]
        return legacy + [NluExample(k, *prompt_and_answer(prompt_format, ex)) for k, ex in extract]
    return [NluExample(k, *prompt_and_answer(prompt_format, ex)) for k, ex in record_task_examples(record, labels)]


def record_task_examples(record: Mapping[str, Any], labels: Mapping[str, Sequence[str]],
                         source: str = "") -> list[tuple[str, TaskExample]]:
    """``(kind, TaskExample)`` for each classification or extraction target of a record; ``source`` prefixes each id."""
    if record.get("prompt") and record.get("response"):
        return []
    asked = [(task, tuple(labels.get(task) or BUILTIN_LABELS[task])) for task in CLASSIFICATION_TASKS]
    if record.get("spans") is not None:
        asked += [("extract", tuple(labels.get("extract") or ()))] if labels.get("extract") else []
    else:
        asked.append(("brand", (BRAND_LABEL,)))
    return [(target, q.example) for target, names in asked
            if (q := target_question(record, target, names, source)) is not None and q.scored]


# The fields each target reads its input from, first present first.
TARGET_INPUTS: dict[str, tuple[str, ...]] = {"category": ("title", "review", "text"), "sentiment": ("review", "text"),
                                             "extract": ("text", "title"), "brand": ("title", "text")}


@dataclass(frozen=True)
class Question:
    """What one target asks of one record, laid out as training lays it out; its gold answer when the record has it.

    Training, evaluation and ``ecomkit.predict`` must read the same input of a row for the same target.
    """

    target: str
    example: TaskExample   # its gold_label / gold_spans hold the record's answer when ``scored``
    scored: bool           # the record carries this target's answer, within ``example.labels``
    note: str = ""         # why an answer the record carries is not scored (a label the set does not hold)


def target_question(record: Mapping[str, Any], target: str, labels: Sequence[str], source: str = "") -> Question | None:
    """The question ``target`` asks of ``record`` with the label set ``labels``; None when it has no input for it."""
    found = first_present(record, TARGET_INPUTS[target])
    if found is None:
        return None
    labels, text, where = tuple(labels), found[1], f"{source}/{target}"
    if target in CLASSIFICATION_TASKS:
        gold = record.get(target)
        scored = gold is not None and gold in labels
        note = f"its {target} {gold!r} is not among the labels {list(labels)}" if gold and not scored else ""
        return Question(target, TaskExample(KIND_CLASSIFY, text, labels, gold if scored else None, source=where),
                        scored, note)
    if target == "extract":
        if record.get("spans") is None:
            return Question(target, TaskExample(KIND_EXTRACT, text, labels, source=where), False)
        spans = tuple((t, term) for t, _, _, term in spans_from_json(record["spans"]) if t in labels)
        return Question(target, TaskExample(KIND_EXTRACT, text, labels, gold_spans=spans, source=where), True)
    brand = record.get("brand")
    scored = bool(brand) and brand in text
    note = f"its brand {brand!r} is not in its {found[0]}" if brand and not scored else ""
    gold = ((BRAND_LABEL, brand),) if scored else ()
    return Question(target, TaskExample(KIND_EXTRACT, text, labels, gold_spans=gold, source=where), scored, note)


def table_task_examples(table: Dataset, labels: Mapping[str, Sequence[str]], name: str) -> list[TaskExample]:
    """The TaskExamples of every record of ``table``, in its order; ids are ``<name>:<record index>/<kind>``."""
    return [ex for i, record in enumerate(table) for _, ex in record_task_examples(record, labels, f"{name}:{i}")]


def train_span_counts(records: Dataset, train_idx: np.ndarray, names: Sequence[str]) -> Counter:
    """``Counter((label, span))`` over the training records' spans whose label is in ``names``."""
    column = read_columns(records, ["spans"]).column(0).take(pa.array(train_idx))
    wanted, counts = set(names), Counter()
    for value in column.to_pylist():
        if value:
            counts.update((label, term) for label, _, _, term in json.loads(value) if label in wanted)
    return counts
