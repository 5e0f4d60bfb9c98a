"""Writers for record files: JSON Lines, CSV and Hugging Face ``save_to_disk`` directories, each loadable by
:func:`ecomkit.data.loaders.load_records` (tests, examples and "bring your own data" demos write with these)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from datasets import Dataset

from ecomkit.data.validate import ALL_FIELDS

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
            # str(float) is the shortest string that parses back to the same float, so prices round-trip exactly.
            writer.writerow({k: "" if record.get(k) is None else record.get(k) for k in fields})
    return path


def write_hf_dataset(records: Iterable[Mapping[str, Any]], directory: str | os.PathLike) -> Path:
    """Write a Hugging Face dataset with ``save_to_disk`` (Arrow shards), loadable by :func:`load_records`."""
    directory = Path(directory)
    Dataset.from_list([dict(r) for r in records]).save_to_disk(str(directory))
    return directory

