"""Writers for record files: JSON Lines, CSV and ``save_to_disk`` folders, each loadable by ``load_records``."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from datasets import Dataset

from ecomkit.data.validate import ALL_FIELDS

ROW_FORMATS = (".jsonl", ".json", ".csv")


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
            # str(float) is the shortest string that parses back to the same float.
            writer.writerow({k: "" if record.get(k) is None else record.get(k) for k in fields})
    return path


def write_hf_dataset(records: Iterable[Mapping[str, Any]], directory: str | os.PathLike) -> Path:
    """Write a Hugging Face dataset with ``save_to_disk`` (Arrow shards), loadable by :func:`load_records`."""
    directory = Path(directory)
    Dataset.from_list([dict(r) for r in records]).save_to_disk(str(directory))
    return directory



def write_rows(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> Path:
    """Rows as JSON Lines (``.jsonl``, ``.json``) or CSV (``.csv``), by the extension of ``path``.

    In a CSV an object field becomes one column per key (``input.review``); lists and deeper objects are JSON text.
    """
    path = Path(path)
    if path.suffix.lower() != ".csv":
        return write_jsonl(rows, path)
    flat = [{f"{k}.{kk}" if isinstance(v, Mapping) else k: vv for k, v in row.items()
             for kk, vv in (v.items() if isinstance(v, Mapping) else [(None, v)])} for row in rows]
    flat = [{k: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v for k, v in row.items()}
            for row in flat]
    return write_csv(flat, path, fields=list(dict.fromkeys(k for row in flat for k in row)))
