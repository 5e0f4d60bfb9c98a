"""Arrow plumbing shared by the loaders, the tokenizer and the build: cache folder, content hashes, columns.

Memory-mapped tables named by a hash of their inputs: ranks share pages, and a second run maps instead of recomputing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from datasets import Dataset, Features
from datasets.arrow_writer import ArrowWriter



def _code_version() -> str:
    """A hash of this package's source: a cached table is never reused by code that would compute it differently."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + path.read_bytes())
    return h.hexdigest()[:16]


# Rows per record batch: opening a table maps 64 KiB around each batch header, so small batches bloat the resident set.
WRITER_BATCH_ROWS = 10_000

# Part of every cache key: changes whenever the validation rules, example formats or token layout change.
FORMAT_VERSION = f"ecomkit-data-{_code_version()}"


def data_cache_dir() -> Path:
    """``$ECOMKIT_CACHE/datasets`` (default ``~/.cache/ecomkit/datasets``): where loaded and tokenized tables live."""
    root = Path(os.environ.get("ECOMKIT_CACHE", Path.home() / ".cache" / "ecomkit"))
    return root / "datasets"


def cached_table(key: str, batches: Callable[[], Iterable[dict[str, list]]], features: Features) -> Dataset:
    """The memory-mapped table ``<cache>/<key>.arrow``, written from ``batches()`` (column dicts) if absent.

    Written to a temporary file and renamed, so no rank ever sees half a table.
    """
    path = data_cache_dir() / f"{key}.arrow"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with ArrowWriter(features=features, path=str(tmp), writer_batch_size=WRITER_BATCH_ROWS) as writer:
            for batch in batches():
                writer.write_batch(batch)
            writer.finalize()
        os.replace(tmp, path)
    return Dataset.from_file(str(path))


def file_digest(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fingerprint(*parts: Any) -> str:
    """A short, stable hash of JSON-serialisable parts (plus :data:`FORMAT_VERSION`)."""
    text = json.dumps([FORMAT_VERSION, *parts], sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def tokenizer_digest(tokenizer) -> str:
    """What identifies a tokenizer's output: its full serialised state (vocab, merges, normaliser, specials)."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    state = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    specials = [tokenizer.eos_token_id, tokenizer.pad_token_id, type(tokenizer).__name__]
    return hashlib.sha256((state + repr(specials)).encode("utf-8")).hexdigest()[:32]
