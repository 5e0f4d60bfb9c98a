"""Every row of a file as training reads it, kept with its location and the user's own columns, good or bad.

``ecomkit.predict`` must answer or name every row, so it reads with training's readers, maps and row validation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ecomkit.data.build import ValidationIssue
from ecomkit.data.columns import map_columns
from ecomkit.data.loaders import (check_column_map, check_columns, check_map_keys, class_label_names, file_row,
                                  file_table, missing_map_keys, open_source)
from ecomkit.data.spans import check_span_end
from ecomkit.data.validate import LABEL_FIELDS, RowProblem, check_label_map, validate_row

_LABEL_REASONS = ("unmapped_label", "invalid_label")   # a row's own label is unreadable, its text is not


@dataclass(frozen=True)
class ReadRow:
    """One row: where it is, the user's columns as read, and the record training reads from it (or why not)."""

    location: str                          # "line 12" (JSONL, CSV), "item 3" (a JSON array), "row 7" (datasets)
    raw: dict[str, Any] | None             # the user's row under their own column names (None: not an object)
    record: dict[str, Any] | None          # :data:`~ecomkit.data.validate.RECORD_FIELDS`, None when unreadable
    issue: ValidationIssue | None = None   # why the record is None
    label_issues: tuple[ValidationIssue, ...] = ()   # labels of the row left out (their text is still read)


@dataclass
class RowsRead:
    """The rows of ``source`` in file order, the column map used, and the keys left out because the file lacks them."""

    source: str
    rows: list[ReadRow]
    column_map: dict[str, str] = field(default_factory=dict)
    absent_keys: list[str] = field(default_factory=list)


def read_rows(path: str | os.PathLike, column_map: Mapping[str, str] | None = None,
              label_map: Mapping[str, Mapping[str, str]] | None = None, *, span_end: str = "exclusive",
              max_chars: int = 4096, optional_keys: Sequence[str] = ()) -> RowsRead:
    """Every row of ``path`` (any format ``--data`` reads), read through ``column_map`` and ``label_map``.

    ``optional_keys`` may match no column (a run's label columns): left out and listed in ``absent_keys``. An unreadable
    label leaves the row's text readable and is said in ``label_issues``.
    """
    path = Path(path)
    column_map, label_map = check_column_map(column_map), check_label_map(label_map)
    check_span_end(span_end)
    ds, columns = open_source(path)
    raw, from_file = (ds, False) if ds is not None else (file_table(path, column_map, keep_columns=True), True)
    optional = {k: v for k, v in column_map.items() if k in optional_keys}
    absent = missing_map_keys(path, raw, optional, from_file, columns)[0] if optional else []
    column_map = {k: v for k, v in column_map.items() if k not in absent}
    if columns is not None:
        check_columns(path, columns, column_map, "lm")
    check_map_keys(path, raw, column_map, from_file)
    if not from_file and "ner_tags" not in label_map:
        label_map.update(check_label_map(class_label_names(raw, column_map)))
    rows = [_read(location, row, column_map, label_map, max_chars, span_end)
            for location, row in _raw_rows(raw, from_file)]
    return RowsRead(str(path), rows, column_map, absent)


def _raw_rows(raw, from_file: bool, batch_rows: int = 1000) -> Iterator[tuple[str, dict | RowProblem]]:
    """``(location, the row as an object)`` for every row, or the problem reading it met."""
    for start in range(0, len(raw), batch_rows):
        batch = raw[start:start + batch_rows]
        for i in range(len(next(iter(batch.values())))):
            if not from_file:
                yield f"row {start + i + 1}", {k: batch[k][i] for k in batch}
                continue
            try:
                yield batch["location"][i], file_row(batch, i)
            except RowProblem as problem:
                yield batch["location"][i], problem


def _read(location: str, row: dict | RowProblem, column_map: Mapping[str, str],
          label_map: Mapping[str, Mapping[str, str]], max_chars: int, span_end: str) -> ReadRow:
    """One row validated as training validates it; an unreadable label is left out and said, not the whole row."""
    if isinstance(row, RowProblem):
        return ReadRow(location, None, None, ValidationIssue(row.reason, location, row.field, row.detail))
    mapped, left_out = map_columns(row, column_map), []
    while True:
        try:
            record = validate_row(mapped, max_chars, label_map, span_end, column_map)
            return ReadRow(location, row, record, label_issues=tuple(left_out))
        except RowProblem as problem:
            issue = ValidationIssue(problem.reason, location, problem.field, problem.detail)
            if problem.reason not in _LABEL_REASONS or problem.field not in LABEL_FIELDS or problem.field not in mapped:
                return ReadRow(location, row, None, issue, tuple(left_out))
            left_out.append(issue)
            mapped = {k: v for k, v in mapped.items() if k != problem.field}
