"""One call from a data source to tokenized train/eval sets: :func:`build_datasets`.

The split is on records before the NLU expansion (no eval record leaks an example into training) and stratified by
label, so rare labels are evaluated and the eval majority baseline is the data's. Nothing is capped silently.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset

from ecomkit import find
from ecomkit.data.stream import cached_table, fingerprint, label_codes, read_columns
from ecomkit.data.catalog import (MIN_ROWS, RECORD_FEATURES, RECORD_FIELDS, SPAN_LABELS, TARGET_FIELDS, catalog_spans,
                                  generate_catalog_chunks, spans_json)
from ecomkit.data.task_file import DEFAULT_PROMPT_FORMAT, check_format, check_labels_spelling
from ecomkit.data.tasks import CLASSIFICATION_TASKS, KINDS, TARGETS, check_task, labels_from_values
from ecomkit.data.lengths import CutCounts, LengthStats, lengths_facts, limit_warning, tokenized_splits
from ecomkit.errors import ConfigError, DataError

if TYPE_CHECKING:
    from ecomkit.data.formats import TaskExample

SYNTHETIC = "synthetic"
# A user's file's reader, imported by name when a file is given (the catalog never loads it).
LOADERS = "ecomkit.data.loaders"
# --seq-len auto's cap when the model's is unknown: BLOOM's training length.
DEFAULT_LENGTH_LIMIT = 2048
MAX_SYNTHETIC_ROWS = 100_000_000


@dataclass(frozen=True)
class ValidationIssue:
    reason: str
    location: str
    field: str | None
    detail: str


@dataclass
class ValidationReport:
    """What a load kept and skipped: ``counts`` per reason, ``total`` rows seen, ``kept`` rows."""

    source: str
    total: int = 0
    kept: int = 0
    counts: Counter = field(default_factory=Counter)
    first_issue: dict[str, ValidationIssue] = field(default_factory=dict)
    unlabeled: int = 0                  # valid rows with nothing for task nlu to learn (no target, spans, pair)
    unlabeled_first: list[str] = field(default_factory=list)   # where the first of them are ("line 7", ...)

    @property
    def skipped(self) -> int:
        return self.total - self.kept

    @property
    def bad_fraction(self) -> float:
        return self.skipped / self.total if self.total else 0.0

    def add_issue(self, issue: ValidationIssue, count: int = 1) -> None:
        self.counts[issue.reason] += count
        self.first_issue.setdefault(issue.reason, issue)

    def summary(self) -> str:
        head = f"{self.source}: kept {self.kept:,} of {self.total:,} rows"
        if not self.skipped:
            return head + "."
        parts = []
        for reason, count in sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0])):
            first = self.first_issue[reason]
            where = f"{first.location}" + (f", field '{first.field}'" if first.field else "")
            parts.append(f"{reason} {count:,} (first at {where}: {first.detail})")
        return f"{head}; skipped {self.skipped:,}: " + "; ".join(parts) + "."


def unlabeled_warning(report: ValidationReport) -> str | None:
    """A line naming the first valid rows that give task nlu nothing to learn, or None when there are none."""
    if not report.unlabeled:
        return None
    more = f" and {report.unlabeled - len(report.unlabeled_first):,} more" \
        if report.unlabeled > len(report.unlabeled_first) else ""
    return (f"{report.source}: {report.unlabeled:,} of {report.kept:,} valid rows have no label ({', '.join(TARGET_FIELDS)}, "
            f"spans or an instruction pair), so task nlu builds no example from them: {', '.join(report.unlabeled_first)}"
            f"{more}. Fill in their labels, or check --column-map if a label column has another name.")


def check_bad_fraction(report: ValidationReport, max_bad_fraction: float) -> None:
    """Stop when more than ``max_bad_fraction`` of the rows were skipped: the file is not what it seems."""
    if report.total and report.bad_fraction > max_bad_fraction:
        raise DataError(
            f"{report.summary()} That is {report.bad_fraction:.1%} of the rows, above max_bad_fraction="
            f"{max_bad_fraction:g} (--max-bad-fraction). Fix the data or its --column-map/--label-map "
            f"(--strict-data names the first bad row), or raise --max-bad-fraction if losing these rows is intended.")


@dataclass
class BuildReport:
    """Where the data came from, what was kept and built, and the candidate labels of each classification target."""

    source: str
    validation: ValidationReport
    n_train_records: int
    n_eval_records: int
    n_train_examples: int
    n_eval_examples: int
    category_labels: tuple[str, ...] = field(default_factory=tuple)
    labels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    examples_per_kind: dict[str, int] = field(default_factory=dict)   # train + eval, kinds with examples
    n_usable: int = 0                  # valid records before any cap
    max_rows: int | None = None        # the cap the caller asked for (None: all rows)
    prompt_format: str = DEFAULT_PROMPT_FORMAT
    eval_examples: list[TaskExample] = field(default_factory=list, repr=False)  # held-out examples, for generation
    spans_outside_labels: dict[str, int] = field(default_factory=dict)          # label -> spans left out
    eval_source: str | None = None     # the eval_data file, when one was given
    eval_validation: ValidationReport | None = None
    seq_len: int = 0                   # the sequence length the rows were fit to (--seq-len, or chosen by auto)
    seq_len_reason: str = ""
    seq_len_at_limit: bool = False     # --seq-len auto stopped at the model's limit, with rows longer than it
    lengths: dict[str, LengthStats] = field(default_factory=dict)   # "train" / "eval": lengths before any cut
    cuts: dict[str, CutCounts] = field(default_factory=dict)        # "train" / "eval": what fitting cut
    train_label_counts: dict[str, Counter] = field(default_factory=dict)        # target -> training gold labels
    labels_not_in_data: tuple[str, ...] = ()   # extraction labels asked for (--labels) that no span carries
    span_labels_in_data: tuple[str, ...] = ()  # the labels the data's spans do carry (when counted)
    _train_spans: object = field(default=None, repr=False, compare=False)       # a Counter, or how to make it

    @property
    def train_spans(self) -> Counter:
        """``Counter((label, span))`` over the training records' spans in the extraction label set."""
        if callable(self._train_spans):
            self._train_spans = self._train_spans()
        return self._train_spans if self._train_spans is not None else Counter()

    @property
    def capped(self) -> bool:
        return self.max_rows is not None and self.max_rows < self.n_usable

    def facts(self) -> dict:
        """The numbers of :meth:`summary` as a dict, for ``summary.json`` and notebooks."""
        v = self.validation
        return {"source": self.source, "rows_read": v.total, "rows_valid": v.kept, "skipped": dict(v.counts),
                "max_rows": self.max_rows, "records_used": self.n_train_records + self.n_eval_records,
                "train_records": self.n_train_records, "eval_records": self.n_eval_records,
                "train_examples": self.n_train_examples, "eval_examples": self.n_eval_examples,
                "examples_per_kind": dict(self.examples_per_kind), "labels": {k: list(v) for k, v in self.labels.items()},
                "prompt_format": self.prompt_format, "eval_source": self.eval_source,
                "eval_skipped": dict(self.eval_validation.counts) if self.eval_validation else {},
                "eval_rows_read": self.eval_validation.total if self.eval_validation else None,
                "spans_outside_labels": dict(self.spans_outside_labels),
                "train_label_counts": {t: dict(c) for t, c in self.train_label_counts.items()}, "seq_len": self.seq_len,
                "seq_len_reason": self.seq_len_reason, "seq_len_at_limit": self.seq_len_at_limit,
                **lengths_facts(self.lengths, self.cuts),
                "labels_not_in_data": list(self.labels_not_in_data),
                "unlabeled_rows": self.validation.unlabeled,
                "unlabeled_first": list(self.validation.unlabeled_first)}

    def lengths_summary(self) -> str:
        """The data line's lengths part: per split, p50/p95/max before any cut and what fitting cut."""
        splits = "; ".join(f"{k}: {v.text()}, {self.cuts[k].text()}" for k, v in self.lengths.items()
                           if k in self.cuts)
        return f"seq_len {self.seq_len} ({self.seq_len_reason}). {splits}."

    def cut_warnings(self) -> list[str]:
        """A line per split whose inputs lost over half, or one when ``--seq-len auto`` reached the model's limit."""
        if self.seq_len_at_limit:
            return [w] if (w := limit_warning(self.seq_len, self.cuts, self.lengths)) else []
        return [w for k, c in self.cuts.items() if (w := c.warning(k, self.lengths[k].rows))]

    def warnings(self) -> list[str]:
        """What the data silently cannot give: labels asked for that never occur, rows with nothing to learn."""
        out = []
        if self.labels_not_in_data:
            found = ", ".join(self.span_labels_in_data) or "none"
            out.append(f"--labels: {', '.join(self.labels_not_in_data)} never occur in the spans of the data (its "
                       f"span labels: {found}); the model cannot learn them and their F1 will be 0. Check the "
                       f"spelling, or leave them out of --labels.")
        out += [w for v in (self.validation, self.eval_validation) if v is not None and (w := unlabeled_warning(v))]
        return out

    def summary(self) -> str:
        used = self.n_train_records + self.n_eval_records
        cap = (f"Capped by max_rows={self.max_rows:,}: using {used:,} of {self.n_usable:,} valid records."
               if self.capped else f"Using all {used:,} valid records.")
        kinds = ", ".join(f"{k} {n:,}" for k, n in self.examples_per_kind.items()) or "none"
        split = (f"Eval set: {self.eval_validation.summary()} Records: " if self.eval_validation
                 else "Split (stratified by label): ")
        outside = ", ".join(f"{k} {n:,}" for k, n in sorted(self.spans_outside_labels.items()))
        dropped = (f" Spans left out, their label not in the extraction labels {list(self.labels.get('extract', ()))}"
                   f": {outside}." if outside else "")
        return (f"{self.validation.summary()} {cap} {split}{self.n_train_records:,} train / "
                f"{self.n_eval_records:,} eval records -> {self.n_train_examples:,} / {self.n_eval_examples:,} "
                f"tokenized examples. Examples built per kind: {kinds}.{dropped} {self.lengths_summary()}")


def build_datasets(source: str | os.PathLike, *, n_rows: int | None = None, seed: int, task: str, tokenizer,
                   max_length: int | str, length_limit: int = DEFAULT_LENGTH_LIMIT, eval_fraction: float = 0.05, column_map: Mapping[str, str] | None = None,
                   strict: bool = False, num_proc: int = 1, label_map: Mapping[str, Mapping[str, str]] | None = None,
                   max_rows: int | None = None, max_bad_fraction: float = 0.05,
                   prompt_format: str = DEFAULT_PROMPT_FORMAT, eval_data: str | os.PathLike | None = None,
                   labels: Sequence[str] | None = None, span_end: str = "exclusive"):
    """Return ``(train_ds, eval_ds, eval_records, report)``.

    ``source="synthetic"`` generates ``n_rows`` catalog rows; any other value is a path for ``load_records``, used whole
    unless ``max_rows`` draws a subset with ``seed``. ``ceil(eval_fraction * n)`` records, stratified by label, are the
    eval set (or the ``eval_data`` file, and every source record trains). ``labels``: the extraction label set, in
    prompt order; ``span_end``: how span-list ends count (:mod:`ecomkit.data.spans`).
    """
    check_task(task)
    check_format(prompt_format)
    if not 0.0 < eval_fraction < 1.0:
        raise ConfigError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}.")
    if max_rows is not None and max_rows < 2:
        raise ConfigError(f"--max-rows must be at least 2 (or 0 for all rows), got {max_rows}.")
    maps = {"column_map": column_map, "strict": strict, "label_map": label_map, "num_proc": num_proc,
            "span_end": span_end}
    records, validation = _source_records(source, n_rows, seed, task, **maps)
    check_bad_fraction(validation, max_bad_fraction)
    n_valid = len(records)
    if max_rows is not None and max_rows < n_valid:
        keep = np.sort(np.random.default_rng([seed, 1]).permutation(n_valid)[:max_rows])
        records = records.select(keep).flatten_indices(
            new_fingerprint=fingerprint("capped", records._fingerprint, max_rows, seed))
    eval_table, eval_validation = None, None
    if eval_data is not None:
        eval_table, eval_validation = _source_records(eval_data, None, seed, task, **maps)
        check_bad_fraction(eval_validation, max_bad_fraction)
    tables = [records] + ([eval_table] if eval_table is not None else [])
    targets = [read_columns(t, CLASSIFICATION_TASKS) for t in tables]
    all_labels = {t: labels_from_values({v for tab in targets for v in pc.unique(tab.column(t)).to_pylist()}, t)
                  for t in CLASSIFICATION_TASKS}
    synthetic = str(source) == SYNTHETIC
    span_counts = None if synthetic and labels is None else _span_label_counts(tables)
    extract = tuple(labels) if labels else (SPAN_LABELS if synthetic else tuple(sorted(span_counts)))
    if extract:
        all_labels["extract"] = extract
    outside = {k: n for k, n in (span_counts or {}).items() if k not in extract}
    never = tuple(k for k in (labels or ()) if not (span_counts or {}).get(k))
    if never:
        check_labels_spelling(labels, sorted(span_counts or ()))
    if eval_table is None:
        order = np.random.default_rng(seed).permutation(len(records))
        eval_idx, train_idx = stratified_split(order, _strata(targets[0], all_labels, order), eval_fraction)
    else:
        eval_idx, train_idx = np.arange(len(eval_table)), np.arange(len(records))
    codes = {t: label_codes(targets[0].column(t), all_labels[t]) for t in CLASSIFICATION_TASKS}
    del targets  # not held while the table is tokenised
    if len(train_idx) == 0:
        raise DataError(f"{source}: only {len(records)} usable records, too few to split off an eval set with "
                        f"eval_fraction={eval_fraction}. Provide more rows, or an eval file (--eval-data FILE).")
    built = tokenized_splits(records, eval_table, eval_idx, tokenizer, task, num_proc, max_length, length_limit,
                              {"labels": all_labels, "prompt_format": prompt_format})
    train_ds, eval_ds, kinds = built.train, built.eval, built.kinds
    is_train = np.zeros(len(records), dtype=bool)
    is_train[train_idx] = True
    train_counts = _train_label_counts(built.examples, is_train, codes, all_labels)
    if eval_table is None:
        eval_records, eval_name = records.select(eval_idx), Path(str(source)).name
    else:
        eval_records, eval_name = eval_table, Path(str(eval_data)).name
    if kinds.sum() == 0:
        raise DataError(f"{source}: no {task} example could be built from {len(records):,} valid records. For task "
                        f"'nlu' a record needs a target (category, sentiment, brand, price) or spans and a text to "
                        f"read it from, or an instruction pair; check --column-map (a nested value is reached by a "
                        f"path: --column-map '{{\"labels.coarse[0]\": \"category\"}}'), or train with --task lm.")
    report = BuildReport(str(source), validation, len(train_idx), len(eval_idx), len(train_ds), len(eval_ds),
                         all_labels["category"], all_labels, {k: int(n) for k, n in zip(KINDS, kinds) if n},
                         n_valid, max_rows, prompt_format, eval_source=None if eval_data is None else str(eval_data),
                         eval_validation=eval_validation, spans_outside_labels=outside, seq_len=built.seq_len,
                         seq_len_reason=built.why, seq_len_at_limit=built.at_limit, lengths=built.stats,
                         cuts=built.cuts, train_label_counts=train_counts,
                         labels_not_in_data=never, span_labels_in_data=tuple(sorted(span_counts or ())))
    if task == "nlu":
        targets = find(TARGETS)
        report.eval_examples = targets.table_task_examples(eval_records, all_labels, eval_name)
        report._train_spans = lambda: targets.train_span_counts(records, train_idx, extract)
    return train_ds, eval_ds, eval_records, report


def _train_label_counts(built: pa.Table, is_train: np.ndarray, codes: Mapping[str, np.ndarray],
                        labels: Mapping[str, Sequence[str]]) -> dict[str, Counter]:
    """Per classification target, the gold labels of its *training* examples (the majority baseline's data).

    Counted from the examples the model trains on, so a record with no input for its label is not counted.
    """
    record = built.column("record").to_numpy()
    kind = built.column("kind").to_numpy()
    out: dict[str, Counter] = {}
    for task in CLASSIFICATION_TASKS:
        rec = record[kind == KINDS.index(task)]
        rec = rec[is_train[rec]]
        found = codes[task][rec]
        counts = np.bincount(found[found >= 0], minlength=len(labels[task]))
        if counts.sum():
            out[task] = Counter({labels[task][i]: int(n) for i, n in enumerate(counts) if n})
    return out


def _span_label_counts(tables: Sequence[Dataset]) -> Counter:
    """Spans per label over the tables (one pass over their ``spans`` column)."""
    counts: Counter = Counter()
    for table in tables:
        for value in read_columns(table, ["spans"]).column(0).to_pylist():
            if value:
                counts.update(label for label, *_ in json.loads(value))
    return counts


def stratified_split(order: np.ndarray, strata: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """``(eval, train)`` indices from ``order``: ``ceil(fraction * n)`` eval rows, each stratum within one row.

    Vectorised systematic sampling over rows grouped by stratum; the eval indices keep the random order.
    """
    n = len(order)
    grouped = np.argsort(strata, kind="stable")
    steps = np.floor(np.arange(n + 1, dtype=np.float64) * fraction + (1.0 - 1e-9))
    chosen = np.zeros(n, dtype=bool)
    chosen[grouped[np.diff(steps) > 0]] = True
    return order[chosen], order[~chosen]


def _strata(targets: pa.Table, labels: Mapping[str, tuple[str, ...]], order: np.ndarray) -> np.ndarray:
    """One integer per row of ``order``: its combination of target labels, 0 for an absent label."""
    key = np.zeros(targets.num_rows, dtype=np.int64)
    for task in CLASSIFICATION_TASKS:
        key = key * (len(labels[task]) + 1) + label_codes(targets.column(task), labels[task]) + 1
    return key[order]


def _source_records(source, n_rows, seed, task, column_map, strict, label_map, num_proc,
                    span_end) -> tuple[Dataset, ValidationReport]:
    if str(source) == SYNTHETIC:
        if n_rows is None or not MIN_ROWS <= n_rows <= MAX_SYNTHETIC_ROWS:
            raise ConfigError(f"--n-rows (the size of the synthetic catalog) must be in {MIN_ROWS}.."
                              f"{MAX_SYNTHETIC_ROWS:,}, "
                              f"got {n_rows} (e.g. --n-rows 2000).")
        records = cached_table(fingerprint("synthetic", n_rows, seed, RECORD_FIELDS),
                               lambda: _synthetic_batches(n_rows, seed),
                               RECORD_FEATURES)
        return records, ValidationReport(source=SYNTHETIC, total=len(records), kept=len(records))
    if n_rows is not None:
        raise ConfigError(f"--n-rows {n_rows} sets the size of the synthetic catalog; {source} is a file, used "
                          f"whole. To use part of it, pass --max-rows.")
    load_records = find(f"{LOADERS}:load_records")
    result = load_records(source, column_map=column_map, task=task, strict=strict, label_map=label_map,
                          num_proc=num_proc, span_end=span_end)
    return result.dataset, result.report


def _synthetic_batches(n_rows: int, seed: int) -> Iterator[dict[str, list]]:
    for chunk in generate_catalog_chunks(n_rows, seed):
        for record in chunk:
            record["spans"] = spans_json(catalog_spans(record), record["title"])
        yield {name: [record.get(name) for record in chunk] for name in RECORD_FIELDS}
