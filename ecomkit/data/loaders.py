"""Load user data (JSONL, CSV, Hugging Face ``save_to_disk`` directories, ``.arrow`` files) into Arrow tables.

Read line by line into a raw table (location, JSON text, reading problem), then validate with a batched map into
records or counted reasons; a bad line is a counted reason, not an exception that aborts a long load. ``column_map``
maps your columns (or paths, :mod:`ecomkit.data.columns`) to ecomkit fields; ``label_map`` maps raw label values.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow.compute as pc
from datasets import Dataset, Features, Value

from ecomkit.data.stream import cached_table, fingerprint, map_batches, read_columns
from ecomkit.data.columns import (describe_columns, found_keys, map_columns, parse_path, path_keys,
                                  unmatched_error)
from ecomkit.data.file_rows import check_json_array, csv_header, csv_rows, json_rows, load_hf_directory
from ecomkit.data.spans import check_span_end
from ecomkit.data.tasks import check_task
from ecomkit.data.build import ValidationIssue, ValidationReport
from ecomkit.data.catalog import RECORD_FEATURES, RECORD_FIELDS, TARGET_FIELDS, TEXT_FIELDS
from ecomkit.data.validate import (
    ALL_FIELDS,
    INSTRUCTION_FIELDS,
    LEARNABLE_FIELDS,
    SPAN_KEY_FIELDS,
    UNLABELED_SHOWN,
    RowProblem,
    check_label_map,
    strict_error,
    validate_row,
)
from ecomkit.errors import ConfigError, DataError, did_you_mean

logger = logging.getLogger(__name__)

SUPPORTED = ".jsonl/.json (JSON Lines or a JSON array), .csv, .arrow, or a directory written by save_to_disk"
RAW_FEATURES = Features({"location": Value("string"), "row": Value("string"), "reason": Value("string"),
                         "field": Value("string"), "detail": Value("string")})
_ISSUE_COLUMNS = ("_reason", "_field", "_detail", "_location")
VALIDATED_FEATURES = Features({**RECORD_FEATURES, **{c: Value("string") for c in _ISSUE_COLUMNS}})


def file_digest(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass
class LoadResult:
    """Valid records as an Arrow table (:data:`RECORD_FIELDS`, None where absent) and the validation report."""

    dataset: Dataset
    report: ValidationReport

    @property
    def records(self) -> list[dict]:
        """The records as dicts without their absent fields: for small data, tests and notebooks."""
        return [{k: v for k, v in row.items() if v is not None} for row in self.dataset]


def load_records(path: str | os.PathLike, *, column_map: Mapping[str, str] | None = None, task: str = "lm",
                 strict: bool = False, max_chars: int = 4096, label_map: Mapping[str, Mapping[str, str]] | None = None,
                 num_proc: int = 1, span_end: str = "exclusive") -> LoadResult:
    """Load and validate records from ``path``, choosing the reader by extension.

    ``strict=True`` raises :class:`DataError` at the first malformed row (file, line, field, fix); otherwise malformed
    rows are skipped and counted per reason in ``result.report``.
    """
    path = Path(path)
    column_map, label_map = check_column_map(column_map), check_label_map(label_map)
    check_task(task)
    check_span_end(span_end)
    raw, from_file = _raw_table(path, column_map, task)
    check_map_keys(path, raw, column_map, from_file)
    if not from_file and "ner_tags" not in label_map:
        label_map.update(check_label_map(class_label_names(raw, column_map)))
    key = fingerprint("validated", raw._fingerprint, column_map, label_map, max_chars, span_end, RECORD_FIELDS)
    validated = map_batches(raw, _validate_batch, key=key, features=VALIDATED_FEATURES, num_proc=num_proc,
                            fn_kwargs={"column_map": column_map, "label_map": label_map, "max_chars": max_chars,
                                       "from_file": from_file, "span_end": span_end}, desc="validating rows")
    report = _report(str(path), validated)
    if task == "nlu":
        _count_unlabeled(report, validated)
    if strict and report.counts:
        first = min(report.first_issue.values(), key=lambda issue: _row_number(issue.location))
        raise strict_error(str(path), first, {ours: theirs for theirs, ours in column_map.items()})
    _refuse_inclusive_offsets(report, validated)
    _finish(report)
    if not report.skipped:
        return LoadResult(validated.remove_columns(list(_ISSUE_COLUMNS)), report)
    good = map_batches(validated, _valid_rows, key=fingerprint("kept", key), features=RECORD_FEATURES,
                       num_proc=num_proc, desc="keeping valid rows")
    return LoadResult(good, report)


def class_label_names(ds: Dataset, column_map: Mapping[str, str]) -> dict:
    """``{"ner_tags": names}`` when the dataset's tag column is a sequence of ``ClassLabel`` (the HF NER convention)."""
    for column, feature in ds.features.items():
        inner = getattr(feature, "feature", None)
        if column_map.get(column, column) == "ner_tags" and getattr(inner, "names", None):
            return {"ner_tags": list(inner.names)}
    return {}


def _refuse_inclusive_offsets(report: ValidationReport, validated: Dataset) -> None:
    """A file whose span ends are inclusive is a convention, not a few bad rows: stop and name the fix."""
    inclusive = report.counts.get("inclusive_span_end", 0)
    if not inclusive:
        return
    with_spans = pc.count(read_columns(validated, ["spans"]).column(0)).as_py()
    if 2 * inclusive >= inclusive + with_spans:
        first = report.first_issue["inclusive_span_end"]
        raise DataError(f"{report.source}: {inclusive:,} of {inclusive + with_spans:,} rows with spans have end "
                        f"offsets that include the last character (first at {first.location}: {first.detail}). "
                        f"ecomkit reads end offsets as exclusive, as in Python slicing. Load with "
                        f"span_end='inclusive' (--span-end inclusive), or add 1 to every end.")


def _row_number(location: str) -> int:
    return int(location.rsplit(" ", 1)[-1])


def _report(source: str, validated: Dataset) -> ValidationReport:
    """Counts per reason and the first row of each, from the issue column (read as codes, no row loop)."""
    reasons = read_columns(validated, ["_reason"]).column(0).combine_chunks()
    report = ValidationReport(source=source, total=len(validated))
    codes = pc.fill_null(reasons.indices, -1).to_numpy(zero_copy_only=False)
    for code, count in enumerate(np.bincount(codes[codes >= 0], minlength=len(reasons.dictionary))):
        if count:
            row = validated[int(np.argmax(codes == code))]
            report.add_issue(ValidationIssue(row["_reason"], row["_location"], row["_field"], row["_detail"]),
                             count=int(count))
    report.kept = report.total - sum(report.counts.values())
    return report


def _count_unlabeled(report: ValidationReport, validated: Dataset) -> None:
    """Count the valid rows without anything task nlu learns from, and note where the first of them are."""
    table = read_columns(validated, ["_reason", "_location", *LEARNABLE_FIELDS])
    empty = pc.is_null(table.column("_reason"))
    for name in LEARNABLE_FIELDS:
        empty = pc.and_(empty, pc.is_null(table.column(name)))
    rows = np.flatnonzero(empty.to_numpy(zero_copy_only=False))
    report.unlabeled = int(len(rows))
    report.unlabeled_first = [table.column("_location")[int(i)].as_py() for i in rows[:UNLABELED_SHOWN]]


def _finish(report: ValidationReport) -> None:
    if report.total == 0:
        raise DataError(f"{report.source} contains no rows. Check that it is the right file and not empty.")
    if report.kept == 0:
        raise DataError(f"No usable rows in {report.source}. {report.summary()} Fix the data or its "
                        f"--column-map/--label-map.")
    if report.skipped:
        logger.warning("%s", report.summary())


def check_column_map(column_map: Mapping[str, str] | None) -> dict[str, str]:
    column_map = dict(column_map or {})
    unknown = {theirs: ours for theirs, ours in column_map.items() if ours not in ALL_FIELDS}
    if unknown:
        hints = "".join(did_you_mean(ours, ALL_FIELDS) for ours in unknown.values())
        raise ConfigError(f"--column-map {unknown} maps to unknown fields.{hints} Map your columns to one of "
                          f"{list(ALL_FIELDS)}, e.g. --column-map '{{\"product_name\": \"title\"}}'.")
    path_keys(column_map)
    return column_map


_SAMPLE_ROWS = 1000   # rows read to learn a JSON file's columns before the full search for a missing one


def _column_keys(column_map: Mapping[str, str]) -> dict[str, str]:
    """The map's keys that name columns (keys mapped to span keys rename keys inside spans instead)."""
    return {k: v for k, v in column_map.items() if v not in SPAN_KEY_FIELDS}


def _missing_heads(columns: Sequence[str], column_map: Mapping[str, str]) -> list[str]:
    """The map keys whose column, or whose path's first name, is not among ``columns``."""
    return [k for k in _column_keys(column_map) if k not in columns and parse_path(k)[0] not in columns]


def _check_heads(path: Path, columns: list[str], column_map: Mapping[str, str]) -> None:
    """A file with a header (CSV, datasets): every map key's column, or its path's first name, must be there."""
    missing = _missing_heads(columns, column_map)
    if missing:
        raise unmatched_error(str(path), missing, columns)


def check_map_keys(path: Path, raw: Dataset, column_map: Mapping[str, str], from_file: bool) -> None:
    """Every ``column_map`` key must match a column (a path: reach a value) in some row; else name the columns."""
    if not _column_keys(column_map) or path.suffix.lower() == ".csv":
        return
    missing, columns = missing_map_keys(path, raw, column_map, from_file)
    if missing:
        raise unmatched_error(str(path), missing, columns)


def missing_map_keys(path: Path, raw: Dataset, column_map: Mapping[str, str], from_file: bool,
                     header: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """The ``column_map`` keys that match no column (a path: reach no value in any row), and the columns found.

    JSON rows each have their own columns, so a key missing from the first rows is searched for in the whole file.
    """
    column_map = _column_keys(column_map)
    if header is not None and from_file:
        return _missing_heads(header, column_map), list(header)
    if not from_file:
        deep = {k: v for k, v in column_map.items() if k not in raw.column_names}
        sample = list(raw.select(range(min(len(raw), _SAMPLE_ROWS))))
        return sorted(set(deep) - found_keys(sample, deep)), describe_columns(sample)
    sample = list(_json_objects(raw.select(range(min(len(raw), _SAMPLE_ROWS)))["row"]))
    missing = set(column_map) - found_keys(sample, column_map)
    for key in sorted(missing):
        if any(found_keys(_json_objects(rows), {key: column_map[key]}) for rows in _rows_naming(raw, key)):
            missing.discard(key)
    return sorted(missing), describe_columns(sample)


def _rows_naming(raw: Dataset, key: str, batch: int = 10_000) -> Iterator[list[str | None]]:
    """The raw JSON rows that contain the first name of ``key`` as a string, ``batch`` at a time."""
    head = json.dumps(str(parse_path(key)[0]), ensure_ascii=False)
    hits = pc.fill_null(pc.match_substring(raw.data.column("row"), head), False)
    index = np.flatnonzero(hits.to_numpy(zero_copy_only=False))
    for start in range(0, len(index), batch):
        yield raw.select(index[start:start + batch])["row"]


def _json_objects(texts: Iterable[str | None]) -> Iterator[dict]:
    """The JSON objects among raw rows (rows with a reading problem, or not objects, are left out)."""
    for text in texts:
        try:
            obj = json.loads(text) if text else None
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            yield obj



def _validate_batch(batch: dict[str, list], indices: list[int], column_map: Mapping[str, str],
                    label_map: Mapping[str, Mapping[str, str]], max_chars: int, from_file: bool,
                    span_end: str = "exclusive") -> dict[str, list]:
    out: dict[str, list] = {name: [] for name in VALIDATED_FEATURES}
    for i, index in enumerate(indices):
        location = batch["location"][i] if from_file else f"row {index + 1}"
        try:
            row = file_row(batch, i) if from_file else {k: batch[k][i] for k in batch}
            raw = map_columns(row, column_map)
            record, issue = validate_row(raw, max_chars, label_map, span_end, column_map), (None, None, None)
        except RowProblem as problem:
            record, issue = dict.fromkeys(RECORD_FIELDS), (problem.reason, problem.field, problem.detail)
        for name in RECORD_FIELDS:
            out[name].append(record[name])
        for column, value in zip(_ISSUE_COLUMNS, (*issue, location)):
            out[column].append(value)
    return out


def _valid_rows(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
    """The rows of a validated batch that have no issue, without the issue columns (a streaming filter)."""
    keep = [i for i, reason in enumerate(batch["_reason"]) if reason is None]
    return {name: [batch[name][i] for i in keep] for name in RECORD_FIELDS}


def file_row(batch: dict[str, list], i: int) -> dict:
    """Row ``i`` of a raw table's batch as the object it holds, or the :class:`RowProblem` reading it met."""
    if batch["reason"][i]:
        raise RowProblem(batch["reason"][i], batch["field"][i], batch["detail"][i])
    try:
        obj = json.loads(batch["row"][i])
    except json.JSONDecodeError as exc:
        raise RowProblem("malformed_line", None, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise RowProblem("malformed_line", None, f"a JSON {type(obj).__name__}, expected an object")
    return obj



def _raw_table(path: Path, column_map: Mapping[str, str], task: str) -> tuple[Dataset, bool]:
    """The file as a raw Arrow table (cached by its SHA-256), or the HF dataset itself; and whether it is a file."""
    ds, columns = open_source(path)
    if columns is not None:
        check_columns(path, columns, column_map, task)
    return (ds, False) if ds is not None else (file_table(path, column_map), True)


def open_source(path: Path) -> tuple[Dataset | None, list[str] | None]:
    """A dataset folder or ``.arrow`` file opened (else None), and the columns the source declares up front."""
    if not path.exists():
        raise _missing_data_error(path)
    suffix = path.suffix.lower()
    if path.is_dir() or suffix == ".arrow":
        ds = load_hf_directory(path) if path.is_dir() else Dataset.from_file(str(path))
        return ds, ds.column_names
    if suffix in (".jsonl", ".json"):
        check_json_array(path)
        return None, None
    if suffix == ".csv":
        return None, csv_header(path)
    raise DataError(f"Cannot tell the format of {path} from its extension '{suffix}'. Supported: {SUPPORTED}.")


def file_table(path: Path, column_map: Mapping[str, str], keep_columns: bool = False) -> Dataset:
    """A file's rows as a raw Arrow table, cached by SHA-256; ``keep_columns``: every CSV column, for predict."""
    every = ("every column",) if keep_columns else ()
    digest = fingerprint("raw", file_digest(path), path.suffix.lower(), column_map, *every)
    return cached_table(digest, lambda: _raw_batches(path, column_map, keep_columns), RAW_FEATURES)


def _raw_batches(path: Path, column_map: Mapping[str, str], keep_columns: bool = False,
                 batch_rows: int = 10_000) -> Iterator[dict[str, list]]:
    """The file's rows as column batches of the raw table; only one batch is held in memory."""
    rows = csv_rows(path, column_map, keep_columns) if path.suffix.lower() == ".csv" else json_rows(path)
    batch: dict[str, list] = {name: [] for name in RAW_FEATURES}
    for location, row in rows:
        problem = row if isinstance(row, RowProblem) else None
        values = (location, None, problem.reason, problem.field, problem.detail) if problem else (
            location, row, None, None, None)
        for name, value in zip(RAW_FEATURES, values):
            batch[name].append(value)
        if len(batch["location"]) == batch_rows:
            yield batch
            batch = {name: [] for name in RAW_FEATURES}
    if batch["location"]:
        yield batch


def _missing_data_error(path: Path) -> DataError:
    return DataError(
        f"Data file not found: {path} (resolved to {path.absolute()}). Check the path; relative paths are "
        f"resolved from the current directory {Path.cwd()}. Supported inputs: {SUPPORTED}. To try ecomkit "
        f"without data of your own, use the source 'synthetic' (the generated catalog)."
    )


def check_columns(path: Path, columns: Iterable[str], column_map: Mapping[str, str], task: str) -> None:
    """One error for the file, not one per row: it needs a text column, and for ``nlu`` something to learn."""
    columns = list(columns)
    _check_heads(path, columns, column_map)
    present = {column_map.get(c, c) for c in columns}
    present |= {column_map[key] for key, steps in path_keys(column_map).items() if steps[0] in columns}
    if not present & {*TEXT_FIELDS, *INSTRUCTION_FIELDS, "tokens"}:
        raise DataError(
            f"{path} has no text column (its columns: {columns}); ecomkit needs one of {list(TEXT_FIELDS)} or an "
            f"instruction pair (instruction/output or prompt/response). Rename a column, or pass "
            f"--column-map '{{\"your_column\": \"text\"}}' (or review, title) to say which column holds the text.")
    if task == "nlu" and not present & {*TARGET_FIELDS, *INSTRUCTION_FIELDS, "spans", "tokens", "label"}:
        raise DataError(
            f"{path} has nothing for task 'nlu' to learn (its columns: {columns}): it needs a target column "
            f"({', '.join(TARGET_FIELDS)}), spans (spans, label, or tokens + ner_tags) or instruction pairs. Map "
            f"one with --column-map '{{\"label\": \"sentiment\"}}' (a nested value by its path: "
            f"'{{\"labels.coarse[0]\": \"category\"}}'), or train with --task lm on the text alone.")
