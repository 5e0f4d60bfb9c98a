"""Load user data (JSONL, CSV, Hugging Face ``save_to_disk`` directories, ``.arrow`` files) and write it back.

Every loader goes through the same validation (:mod:`ecomkit.data.validate`),
so a row is accepted or rejected for the same reasons whatever the format.
Files are read as bytes and decoded line by line, so one line in a foreign
encoding is reported as ``undecodable_bytes`` with its line number instead of
aborting the whole load with a ``UnicodeDecodeError`` traceback.

``column_map`` maps *your* column names to ecomkit fields, e.g.
``{"product_name": "title", "cost": "price"}``; error messages name your
column. Fields: required per task (see ``required_fields_for_task``), plus the
optional ``category``, ``sentiment``, ``sku`` and ``brand``; other columns are
ignored.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from datasets import Dataset, DatasetDict, load_from_disk

from ecomkit.data.tasks import required_fields_for_task
from ecomkit.data.validate import (
    ALL_FIELDS,
    RowProblem,
    ValidationIssue,
    ValidationReport,
    strict_error,
    validate_row,
)
from ecomkit.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

SUPPORTED = ".jsonl/.json (JSON Lines or a JSON array), .csv, .arrow, or a directory written by save_to_disk"


@dataclass
class LoadResult:
    """Valid records (ecomkit field names, price as float) and the validation report."""

    records: list[dict]
    report: ValidationReport


def load_records(path: str | os.PathLike, *, column_map: Mapping[str, str] | None = None, task: str = "lm",
                 strict: bool = False, max_chars: int = 4096) -> LoadResult:
    """Load and validate records from ``path``, choosing the reader by extension.

    ``strict=True`` raises :class:`DataError` at the first malformed row
    (file, line, field, fix). Otherwise malformed rows are skipped, counted per
    reason in ``result.report`` and the summary is logged as a warning.
    """
    path = Path(path)
    column_map = _check_column_map(column_map)
    required = required_fields_for_task(task)
    rows = _rows_for(path, column_map, required)
    report = ValidationReport(source=str(path))
    column_of = {ours: theirs for theirs, ours in column_map.items()}
    records = []
    for location, raw in rows:
        report.total += 1
        try:
            if isinstance(raw, RowProblem):
                raise raw
            records.append(validate_row(_rename(raw, column_map), required, max_chars))
        except RowProblem as problem:
            issue = ValidationIssue(problem.reason, location, problem.field, problem.detail)
            if strict:
                raise strict_error(str(path), issue, column_of) from None
            report.add_issue(issue)
    report.kept = len(records)
    _finish(report)
    return LoadResult(records, report)


def _finish(report: ValidationReport) -> None:
    if report.total == 0:
        raise DataError(f"{report.source} contains no rows. Check that it is the right file and not empty.")
    if report.kept == 0:
        raise DataError(f"No usable rows in {report.source}. {report.summary()} Fix the data or its column_map.")
    if report.skipped:
        logger.warning("%s", report.summary())


def _check_column_map(column_map: Mapping[str, str] | None) -> dict[str, str]:
    column_map = dict(column_map or {})
    unknown = {theirs: ours for theirs, ours in column_map.items() if ours not in ALL_FIELDS}
    if unknown:
        raise ConfigError(f"column_map {unknown} maps to unknown fields; map your columns to one of "
                          f"{list(ALL_FIELDS)}, e.g. column_map={{'product_name': 'title'}}.")
    return column_map


def _rename(raw: Mapping[str, Any], column_map: Mapping[str, str]) -> dict:
    return {column_map.get(key, key): value for key, value in raw.items()}


def _missing_data_error(path: Path) -> DataError:
    return DataError(
        f"Data file not found: {path} (resolved to {path.absolute()}). Check the path; relative paths are "
        f"resolved from the current directory {Path.cwd()}. Supported inputs: {SUPPORTED}. To try ecomkit "
        f"without data of your own, use the source 'synthetic' (the generated catalog)."
    )


def _rows_for(path: Path, column_map: Mapping[str, str], required) -> Iterator[tuple[str, Any]]:
    if not path.exists():
        raise _missing_data_error(path)
    suffix = path.suffix.lower()
    if path.is_dir():
        return _hf_rows(_load_hf_directory(path), column_map, required, path)
    if suffix == ".arrow":
        return _hf_rows(Dataset.from_file(str(path)), column_map, required, path)
    if suffix in (".jsonl", ".json"):
        return _json_rows(path)
    if suffix == ".csv":
        return _csv_rows(path, column_map, required)
    raise DataError(f"Cannot tell the format of {path} from its extension '{suffix}'. Supported: {SUPPORTED}.")


# ---------------------------------------------------------------- JSON Lines

def _json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    data = path.read_bytes()
    if data.lstrip()[:1] == b"[":
        yield from _json_array_rows(path, data)
        return
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue  # blank lines (e.g. a trailing newline) are not rows
        yield f"line {number}", _parse_json_line(line)


def _parse_json_line(line: bytes) -> Any:
    try:
        text = line.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return RowProblem("undecodable_bytes", None, f"byte 0x{line[exc.start]:02x} at column {exc.start + 1} is "
                                                     f"not valid UTF-8")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return RowProblem("malformed_line", None, f"not valid JSON ({exc.msg} at column {exc.colno})")
    if not isinstance(obj, dict):
        return RowProblem("malformed_line", None, f"a JSON {type(obj).__name__}, expected an object")
    return obj


def _json_array_rows(path: Path, data: bytes) -> Iterator[tuple[str, Any]]:
    try:
        items = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} starts like a JSON array but cannot be parsed ({exc}). Fix the file, or "
                        f"convert it to JSON Lines (one object per line) so bad rows can be skipped one by one.")
    for number, obj in enumerate(items, start=1):
        yield f"item {number}", obj if isinstance(obj, dict) else RowProblem(
            "malformed_line", None, f"a JSON {type(obj).__name__}, expected an object")


# ----------------------------------------------------------------------- CSV

def _csv_rows(path: Path, column_map: Mapping[str, str], required) -> Iterator[tuple[str, Any]]:
    # surrogateescape keeps undecodable bytes as lone surrogates, found per field below,
    # so one bad line does not make the whole file unreadable.
    text = path.read_bytes().decode("utf-8", errors="surrogateescape").removeprefix("\ufeff")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return
    _check_header(path, header, column_map, required)
    last_line = reader.line_num
    for values in reader:
        location, last_line = f"line {last_line + 1}", reader.line_num
        if not any(v.strip() for v in values):
            continue
        if len(values) != len(header):
            yield location, RowProblem("malformed_line", None,
                                       f"{len(values)} columns, the header has {len(header)}")
            continue
        yield location, _csv_record(header, values, column_map)


def _csv_record(header: list[str], values: list[str], column_map: Mapping[str, str]) -> Any:
    for column, value in zip(header, values):
        if column_map.get(column, column) in ALL_FIELDS and any("\udc80" <= ch <= "\udcff" for ch in value):
            return RowProblem("undecodable_bytes", column_map.get(column, column),
                              f"column '{column}' contains bytes that are not valid UTF-8")
    return dict(zip(header, values))


def _check_header(path: Path, columns: Iterable[str], column_map: Mapping[str, str], required) -> None:
    """A required field absent from the header is one error for the file, not one per row."""
    present = {column_map.get(c, c) for c in columns}
    missing = [f for f in required if f not in present]
    if missing:
        raise DataError(
            f"{path} has no column for the required field(s) {missing} (its columns: {list(columns)}). "
            f"Rename the columns, or pass column_map={{'your_column': '{missing[0]}'}} to say which column "
            f"holds it.")


# --------------------------------------------------------- Hugging Face datasets

def _load_hf_directory(path: Path):
    try:
        ds = load_from_disk(str(path))
    except FileNotFoundError as exc:
        raise DataError(f"{path} is a directory but not a dataset written by save_to_disk ({exc}). Pass the "
                        f"directory given to Dataset.save_to_disk, or a .jsonl/.csv file.") from None
    if isinstance(ds, DatasetDict):
        if len(ds) != 1:
            raise DataError(f"{path} holds a DatasetDict with splits {list(ds)}; pass one split's directory, "
                            f"e.g. {path / next(iter(ds))}.")
        ds = next(iter(ds.values()))
    assert isinstance(ds, Dataset)
    return ds


def _hf_rows(ds, column_map: Mapping[str, str], required, path: Path) -> Iterator[tuple[str, Any]]:
    _check_header(path, ds.column_names, column_map, required)
    for number, row in enumerate(ds.to_list(), start=1):
        yield f"row {number}", row


# ------------------------------------------------------------------- writers

def write_jsonl(records: Iterable[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Write one JSON object per line, UTF-8, Chinese kept readable (no \\u escapes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def write_csv(records: Iterable[Mapping[str, Any]], path: str | os.PathLike,
              fields: list[str] | None = None) -> Path:
    """Write a UTF-8 CSV with a header; ``fields`` defaults to the ecomkit fields present in the records."""
    records = list(records)
    if fields is None:
        present = set().union(*(r.keys() for r in records)) if records else set()
        fields = [f for f in ALL_FIELDS if f in present] + sorted(present - set(ALL_FIELDS))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for record in records:
            writer.writerow({k: _csv_value(record.get(k)) for k in fields})
    return path


def _csv_value(value: Any) -> Any:
    # str(float) is the shortest string that parses back to the same float, so prices round-trip exactly.
    return "" if value is None else value


def write_hf_dataset(records: Iterable[Mapping[str, Any]], directory: str | os.PathLike) -> Path:
    """Write a Hugging Face dataset with ``save_to_disk`` (Arrow shards), loadable by :func:`load_records`."""
    directory = Path(directory)
    Dataset.from_list([dict(r) for r in records]).save_to_disk(str(directory))
    return directory
