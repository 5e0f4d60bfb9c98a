"""Raw rows from each file format ``--data`` reads: JSON Lines or a JSON array, CSV, a ``save_to_disk`` folder.

Only file -> ``(location, raw row)`` pairs, with line or item numbers; validation is the loader's, for every format.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from datasets import Dataset, DatasetDict, load_from_disk

from ecomkit.data.columns import heads, path_keys
from ecomkit.data.validate import ALL_FIELDS, RowProblem
from ecomkit.errors import DataError

_CSV_FIELD_LIMIT = 1 << 27  # characters per CSV field (the csv module's default, 131,072, refuses long reviews)



def json_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with open(path, "rb") as f:
        head = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head[:1] == b"[":
        yield from _json_array_rows(path)
        return
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                yield f"line {number}", RowProblem("undecodable_bytes", None, f"byte 0x{line[exc.start]:02x} at "
                                                   f"column {exc.start + 1} is not valid UTF-8")
                continue
            yield f"line {number}", text.strip()


def check_json_array(path: Path) -> None:
    with open(path, "rb") as f:
        head = f.read(64).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head[:1] == b"[":
        _parse_json_array(path)


def _parse_json_array(path: Path) -> list:
    try:
        return json.loads(path.read_bytes().decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} starts like a JSON array but cannot be parsed ({exc}). Fix the file, or "
                        f"convert it to JSON Lines (one object per line) so bad rows can be skipped one by one.")


def _json_array_rows(path: Path) -> Iterator[tuple[str, Any]]:
    for number, obj in enumerate(_parse_json_array(path), start=1):
        yield f"item {number}", json.dumps(obj, ensure_ascii=False)



def _open_csv(path: Path):
    # surrogateescape keeps undecodable bytes (found per field below) so one bad line does not lose the file.
    csv.field_size_limit(max(csv.field_size_limit(), _CSV_FIELD_LIMIT))
    return io.TextIOWrapper(open(path, "rb"), encoding="utf-8-sig", errors="surrogateescape", newline="")


def csv_header(path: Path) -> list[str]:
    with _open_csv(path) as f:
        return next(csv.reader(f), [])


def csv_rows(path: Path, column_map: Mapping[str, str], keep_columns: bool = False) -> Iterator[tuple[str, Any]]:
    """A CSV's rows as JSON texts of the columns ecomkit reads (``keep_columns``: of every column)."""
    read = heads(path_keys(column_map))
    with _open_csv(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            return
        last_line = reader.line_num
        for values in reader:
            location, last_line = f"line {last_line + 1}", reader.line_num
            if not any(v.strip() for v in values):
                continue
            if len(values) != len(header):
                yield location, RowProblem("malformed_line", None,
                                           f"{len(values)} columns, the header has {len(header)}")
                continue
            yield location, _csv_record(header, values, column_map, read, keep_columns)


def _csv_record(header: list[str], values: list[str], column_map: Mapping[str, str],
                read: set[str] = frozenset(), keep_columns: bool = False) -> Any:
    row = {}
    for column, value in zip(header, values):
        ours = column_map.get(column, column)
        if ours not in ALL_FIELDS and column not in read:
            if keep_columns:
                row[column] = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            continue
        if any("\udc80" <= ch <= "\udcff" for ch in value):
            return RowProblem("undecodable_bytes", ours, f"column '{column}' contains bytes that are not valid UTF-8")
        row[column] = value
    return json.dumps(row, ensure_ascii=False)



def load_hf_directory(path: Path):
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


__all__ = ["check_json_array", "csv_header", "csv_rows", "json_rows", "load_hf_directory"]
