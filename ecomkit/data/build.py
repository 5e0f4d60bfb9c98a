"""One call from a data source to tokenized train/eval sets: :func:`build_datasets`.

The split is done on *records* before the NLU expansion, so an eval record
never has one of its instruction examples in the training set.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ecomkit.data.catalog import generate_catalog
from ecomkit.data.loaders import load_records
from ecomkit.data.tasks import category_labels_for, check_task
from ecomkit.data.tokenize import tokenize_records
from ecomkit.data.validate import ValidationReport
from ecomkit.errors import ConfigError, DataError

SYNTHETIC = "synthetic"


@dataclass
class BuildReport:
    """Where the data came from and what was kept, plus the category candidates used in NLU prompts."""

    source: str
    validation: ValidationReport
    n_train_records: int
    n_eval_records: int
    n_train_examples: int
    n_eval_examples: int
    category_labels: tuple[str, ...] = field(default_factory=tuple)

    def summary(self) -> str:
        return (f"{self.validation.summary()} Split: {self.n_train_records:,} train / {self.n_eval_records:,} "
                f"eval records -> {self.n_train_examples:,} / {self.n_eval_examples:,} tokenized examples.")


def build_datasets(source: str | os.PathLike, *, n_rows: int | None, seed: int, task: str, tokenizer,
                   max_length: int, eval_fraction: float = 0.05, column_map: Mapping[str, str] | None = None,
                   strict: bool = False, num_proc: int = 1):
    """Return ``(train_ds, eval_ds, raw_eval_records, report)``.

    ``source="synthetic"`` generates ``n_rows`` catalog rows with ``seed``;
    any other value is a path loaded with ``load_records`` (by extension, or a
    ``save_to_disk`` directory), shuffled with ``seed`` and capped at
    ``n_rows`` if given. The first ``ceil(eval_fraction * n)`` shuffled records
    are the eval set, so the split depends only on ``(data, seed)``.
    ``raw_eval_records`` are the eval records as dicts, for candidate-scoring
    accuracy (``build_classification_example``). ``report`` is a
    :class:`BuildReport` (``report.validation`` is the loader's report,
    ``report.category_labels`` the candidates to use for category accuracy).
    """
    check_task(task)
    if not 0.0 < eval_fraction < 1.0:
        raise ConfigError(f"eval_fraction must be between 0 and 1 (exclusive), got {eval_fraction}.")
    records, validation = _source_records(source, n_rows, seed, task, column_map, strict)
    order = np.random.default_rng(seed).permutation(len(records))
    records = [records[i] for i in order[: n_rows or len(records)]]
    n_eval = math.ceil(eval_fraction * len(records))
    if n_eval >= len(records):
        raise DataError(f"{source}: only {len(records)} usable records, too few to split off an eval set with "
                        f"eval_fraction={eval_fraction}. Provide more rows.")
    eval_records, train_records = records[:n_eval], records[n_eval:]
    labels = category_labels_for(records)
    train_ds = tokenize_records(train_records, tokenizer, task, max_length, num_proc, labels)
    eval_ds = tokenize_records(eval_records, tokenizer, task, max_length, num_proc, labels)
    report = BuildReport(str(source), validation, len(train_records), len(eval_records), len(train_ds),
                         len(eval_ds), labels)
    return train_ds, eval_ds, eval_records, report


def _source_records(source, n_rows, seed, task, column_map, strict) -> tuple[list[dict], ValidationReport]:
    if str(source) == SYNTHETIC:
        if n_rows is None:
            raise ConfigError("n_rows is required for the synthetic catalog (e.g. n_rows=2000).")
        records = generate_catalog(n_rows, seed)
        return records, ValidationReport(source=SYNTHETIC, total=len(records), kept=len(records))
    if n_rows is not None and n_rows < 2:
        raise ConfigError(f"n_rows must be at least 2 (or None for all rows), got {n_rows}.")
    result = load_records(source, column_map=column_map, task=task, strict=strict)
    return result.records, result.report
