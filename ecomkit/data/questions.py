"""What a saved model is asked of each row: the targets its run recorded, one question per row and target.

In ``data/`` because which target a row is asked about, and which columns it reads, is the same for training,
evaluation and ``ecomkit.predict``; only decoding needs a model.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from ecomkit.data.build import ValidationIssue
from ecomkit.data.formats import KIND_CLASSIFY, KIND_EXTRACT, check_kind
from ecomkit.data.rows import ReadRow
from ecomkit.data.targets import Question, target_question
from ecomkit.data.task_file import LABEL_CUTOFF, span_counts
from ecomkit.data.tasks import BRAND_LABEL, CLASSIFICATION_TASKS
from ecomkit.data.validate import RowProblem, validate_row
from ecomkit.errors import ConfigError, DataError, did_you_mean


SHOWN_PROBLEMS = 5        # rows named on the screen per kind of problem (the output file names every one)

TASK_ALIASES = {"classify": KIND_CLASSIFY, "classification": KIND_CLASSIFY, "cls": KIND_CLASSIFY,
                "extract": KIND_EXTRACT, "extraction": KIND_EXTRACT, "ner": KIND_EXTRACT}
DEFAULT_TARGET = {KIND_CLASSIFY: "category", KIND_EXTRACT: "extract"}   # whose input a label set of its own reads


def split_labels(labels: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"品牌,颜色"`` (or ``，``/``、``) or a list → a label tuple in the given order."""
    if labels is None:
        return ()
    if isinstance(labels, str):
        for sep in ("，", "、"):
            labels = labels.replace(sep, ",")
        labels = labels.split(",")
    return tuple(label.strip() for label in labels if label.strip())


class Recorded:
    """What a saved model's ``ecomkit_task.json`` says predict should default to (nothing for other models)."""

    def __init__(self, info: dict[str, Any] | None, model_dir: str = ""):
        info = info or {}
        self.model_dir = model_dir
        kinds, labels = set(info.get("kinds") or ()), info.get("labels") or {}
        self.label_sets: dict[str, dict[str, tuple[str, ...]]] = {KIND_CLASSIFY: {}, KIND_EXTRACT: {}}
        for target in CLASSIFICATION_TASKS:
            if target in kinds and len(labels.get(target) or ()) >= 2:
                self.label_sets[KIND_CLASSIFY][target] = tuple(labels[target])
        if "extract" in kinds and labels.get("extract"):
            self.label_sets[KIND_EXTRACT]["extract"] = tuple(labels["extract"])
        elif "brand" in kinds:
            self.label_sets[KIND_EXTRACT]["brand"] = (BRAND_LABEL,)
        learned = [kind for kind, sets in self.label_sets.items() if sets]
        self.task = learned[0] if len(learned) == 1 else None
        self.seq_len = info.get("seq_len")
        self.gen_max_new_tokens = info.get("gen_max_new_tokens")
        self.reading: dict[str, Any] = dict(info.get("reading") or {})
        baselines = info.get("baselines") or {}
        self.train_label_counts = {t: Counter(c) for t, c in (baselines.get("train_label_counts") or {}).items()}
        self.train_spans = span_counts(baselines["train_spans"]) if "train_spans" in baselines else None

    def targets(self, kind: str | None = None) -> list[tuple[str, str, tuple[str, ...]]]:
        """``(kind, target, labels)`` of every target the model learned (of ``kind`` only, when given)."""
        return [(k, target, labels) for k, sets in self.label_sets.items() if kind in (None, k)
                for target, labels in sets.items()]

    def target_of(self, labels: Sequence[str], kind: str | None = None) -> tuple[str, str] | None:
        """``(kind, target)`` of the learned target whose label set is ``labels``, if one is."""
        return next(((k, t) for k, t, names in self.targets(kind) if names == tuple(labels)), None)

    def no_task(self, where: str) -> DataError:
        learned = " and ".join(k for k, sets in self.label_sets.items() if sets)
        why = f" (the model learned {learned})" if learned else ""
        return DataError(f"{where}: no task{why}; give --task classify|extract or a 'task' field in the row.")

    def check_spelling(self, labels: Sequence[str]) -> None:
        """``--labels`` names one typo off a label the model learned, and learned nowhere: an error naming it."""
        learned = [name for _, _, names in self.targets() for name in names]
        hints = {n: h for n in labels if n not in learned and (h := did_you_mean(n, learned, LABEL_CUTOFF))}
        if hints:
            said = " ".join(f"{n!r} is not a label it learned.{h}" for n, h in hints.items())
            raise ConfigError(f"--labels: {said} {self.model_dir} learned: "
                              f"{'; '.join(f'{t} {list(v)}' for _, t, v in self.targets())}.")


@dataclass
class Item:
    """One output row: a row's question for one target, its answer, or why the row cannot be answered."""

    row: ReadRow
    target: str = ""
    question: Question | None = None
    error: str = ""
    answer: dict[str, Any] = field(default_factory=dict)


def row_items(row: ReadRow, task: str | None, labels: tuple[str, ...], recorded: Recorded, where: str,
              mapped: set[str] = frozenset()) -> list[Item]:
    """The questions one row asks: one per learned target when no labels are given, else the one asked.

    The row's own ``task``/``labels`` come first, then ``--task``/``--labels``, then what the run recorded.
    """
    if row.record is None:
        issue = row.issue
        return [Item(row, error=f"{issue.detail} [{issue.reason}]" + (f", field '{issue.field}'" if issue.field
                                                                      else ""))]
    own = {k: (row.raw or {}).get(k) for k in ("task", "labels") if k not in mapped}
    listed = own.get("labels")
    own_labels = isinstance(listed, str) or (isinstance(listed, list) and all(isinstance(v, str) for v in listed))
    asked = split_labels(listed if own_labels else None) or labels
    asked_task = own["task"] if isinstance(own.get("task"), str) else task
    kind = TASK_ALIASES.get(asked_task.lower()) if asked_task else None
    if asked_task and kind is None:
        raise recorded.no_task(where)
    if asked:
        kind = kind or (recorded.target_of(asked) or (None,))[0] or recorded.task
        if kind is None:
            raise recorded.no_task(where)
        found = recorded.target_of(asked, kind)
        return [_item(row, found[1] if found else "", asked, kind)]
    targets = recorded.targets(kind)
    if not targets and (kind or recorded.task) is None:
        raise recorded.no_task(where)
    if not targets:
        raise DataError(f"{where}: no labels; give --labels 品牌,颜色 or a 'labels' field in the row (the model "
                        f"records no {kind} label set).")
    return [_item(row, target, names, k) for k, target, names in targets]


def _item(row: ReadRow, target: str, labels: tuple[str, ...], kind: str) -> Item:
    """The item for ``target`` (a learned one), or for a label set of the user's own (``target`` empty)."""
    question = target_question(row.record, target or DEFAULT_TARGET[check_kind(kind)], labels, row.location)
    if question is None:
        inputs = {"category": "title, review or text", "sentiment": "review or text", "brand": "title or text"}
        field_names = inputs.get(target or DEFAULT_TARGET[kind], "text or title")
        return Item(row, target, error=f"no {field_names} to read {target or kind} from")
    if not target:   # a label set the model did not learn as a target: answered, not scored
        question = Question("", question.example, False)
    return Item(row, target, question)


def notes_of(item: Item) -> str:
    """Why a label the row carries is not scored: outside the label set, or unreadable by the label map."""
    notes = [item.question.note] if item.question is not None and item.question.note else []
    return "; ".join(notes + [f"its {i.field} left out: {i.detail}" for i in item.row.label_issues
                              if i.field == item.target])


def output_row(item: Item, with_input: bool) -> dict[str, Any]:
    """One output row: where and what it read, the answer, the gold label and whether it is right (or why not)."""
    out: dict[str, Any] = {"location": item.row.location, "input": item.row.raw} if with_input else {}
    q = item.question
    if q is not None:
        out.update({"target": item.target or None, "task": q.example.kind, "labels": list(q.example.labels),
                    "text": q.example.text})
    elif item.target:
        out["target"] = item.target
    if item.error:
        shown = {} if with_input or item.row.raw is None else {"text": item.row.raw.get("text")}
        return {**out, **shown, "error": item.error}
    out.update(item.answer)
    if q.scored:
        gold = q.example.gold_label if q.example.kind == KIND_CLASSIFY else {
            label: [s for lab, s in q.example.gold_spans if lab == label] for label in q.example.labels}
        if q.example.kind == KIND_EXTRACT:
            gold = {k: v for k, v in gold.items() if v}
        out.update(gold=gold, correct=(out.get("label") if q.example.kind == KIND_CLASSIFY else out["spans"]) == gold)
    note = notes_of(item)
    return {**out, **({"note": note} if note else {})}


def problem_lines(items: Sequence[Item], source: str, n_rows: int, output: str | None) -> list[str]:
    """The rows that could not be answered, and the labels that could not be scored: counted, the first named."""
    lines = []
    for what, chosen, why in (("could not be answered", [i for i in items if i.error], lambda i: i.error),
                              ("carry a label that is not scored", [i for i in items if not i.error and notes_of(i)],
                               notes_of)):
        rows = list(dict.fromkeys(i.row.location for i in chosen))
        if rows:
            named = "; ".join(f"{i.row.location}{f' ({i.target})' if i.target else ''}: {why(i)}"
                              for i in chosen[:SHOWN_PROBLEMS])
            more = f"; and {len(chosen) - SHOWN_PROBLEMS} more" if len(chosen) > SHOWN_PROBLEMS else ""
            where = f" (each is in {output} with its {'error' if 'answered' in what else 'note'})" if output else ""
            lines.append(f"{len(rows):,} of {n_rows:,} rows of {source} {what}{where}: {named}{more}.")
    return lines


def command_line_rows(texts: Sequence[str]) -> list[ReadRow]:
    """Texts given on the command line, read as rows ``{"text": ...}`` (an empty one cannot be answered)."""
    rows = []
    for n, text in enumerate(texts, start=1):
        try:
            rows.append(ReadRow(f"text {n}", {"text": text}, validate_row({"text": text})))
        except RowProblem as problem:
            rows.append(ReadRow(f"text {n}", {"text": text}, None, ValidationIssue(
                problem.reason, f"text {n}", problem.field, problem.detail)))
    return rows
