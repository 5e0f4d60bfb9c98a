"""Arrow tables on disk: the cache named by content hashes, and a batched map that streams its source.

Tables are memory-mapped and named by a hash of their inputs: ranks share pages, a second run maps instead of
recomputing. :func:`map_batches` streams record batches rather than reading through the memory map (whose touched
pages stay resident), into shards renamed into place when complete, independent of ``num_proc``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import multiprocess
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets import Dataset, Features, concatenate_datasets
from datasets.arrow_writer import ArrowWriter
from datasets.utils import tqdm as hf_tqdm


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


BatchFn = Callable[..., dict[str, list]]   # fn(batch: dict[str, list], indices: list[int], **fn_kwargs)
MAX_PIECE_ROWS = 200_000                   # rows per shard: the progress bar moves at least this often


@dataclass(frozen=True)
class Piece:
    """A run of record batches, read from ``(file, byte offset)`` pairs; its first row is ``first_row``."""

    batches: tuple[tuple[str, int], ...]
    first_row: int
    rows: int


def batch_offsets(path: str) -> list[tuple[int, int]]:
    """``(byte offset, rows)`` of every record batch in an Arrow IPC stream file, in one sequential read."""
    offsets = []
    with pa.OSFile(path) as f:
        schema = pa.ipc.read_schema(pa.ipc.read_message(f))
        while True:
            position = f.tell()
            try:
                message = pa.ipc.read_message(f)
            except EOFError:
                return offsets
            offsets.append((position, pa.ipc.read_record_batch(message, schema).num_rows))


def _stream_files(ds: Dataset) -> list[str] | None:
    """The files behind ``ds`` in order (indices mapping aside), or None if not file-backed or a file lacks a column."""
    files = [c["filename"] for c in ds.cache_files]
    if not files or any(not set(ds.column_names) <= set(_file_schema(path).names) for path in files):
        return None
    return files


def _file_runs(ds: Dataset) -> list[tuple[str, int, int]] | None:
    """``(file, byte offset, rows)`` of every record batch behind ``ds``, or None unless they hold exactly its rows."""
    files = _stream_files(ds)
    if files is None:
        return None
    runs = [(path, offset, rows) for path in files for offset, rows in batch_offsets(path)]
    return runs if sum(rows for *_, rows in runs) == ds.data.num_rows else None


def plan_pieces(ds: Dataset, num_proc: int) -> list[Piece] | None:
    """The table's rows as pieces read straight from its files, or None when they cannot be streamed."""
    runs = None if ds._indices is not None else _file_runs(ds)
    if runs is None:
        return None
    target = min(MAX_PIECE_ROWS, max(1, math.ceil(len(ds) / (4 * num_proc))))
    pieces, current, first, rows = [], [], 0, 0
    for path, offset, n in runs:
        current.append((path, offset))
        rows += n
        if rows >= target:
            pieces.append(Piece(tuple(current), first, rows))
            current, first, rows = [], first + rows, 0
    if current or not pieces:
        pieces.append(Piece(tuple(current), first, rows))
    return pieces


def read_columns(ds: Dataset, names: Sequence[str]) -> pa.Table:
    """Columns of ``ds`` as an in-memory table, read batch by batch with plain reads when it is file-backed.

    Reading through the memory map faults in 64 KiB around each touched page; strings come back dictionary-encoded.
    """
    names = list(names)
    files = _stream_files(ds)
    table = _read_files(files, names) if files else None
    if table is None or table.num_rows != ds.data.num_rows:
        table = ds.data.table.select(names)
        table = pa.table({name: pa.chunked_array([_owned(c) for c in table.column(name).chunks],
                                                 type=_owned_type(table.schema.field(name).type))
                          for name in names})
    table = table.unify_dictionaries().combine_chunks()
    return table if ds._indices is None else table.take(ds._indices.column(0))


def _read_files(files: Sequence[str], names: Sequence[str]) -> pa.Table | None:
    """``names`` from every record batch of ``files``, in order, in new buffers; None when there is no batch."""
    chunks: dict[str, list[pa.Array]] = {name: [] for name in names}
    for path in files:
        with pa.OSFile(path) as f:
            for batch in pa.ipc.open_stream(f):
                for name in names:
                    chunks[name].append(_owned(batch.column(name)))
    if not chunks[names[0]]:
        return None
    return pa.table({name: pa.chunked_array(parts) for name, parts in chunks.items()})


def _owned_type(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return pa.dictionary(pa.int32(), arrow_type)
    return arrow_type


def _owned(column: pa.Array) -> pa.Array:
    """A column in new buffers (dictionary-encoded when it holds strings): it keeps no read batch alive."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return column.dictionary_encode()
    return pa.concat_arrays([column])


def column_numpy(ds: Dataset, name: str) -> np.ndarray:
    """A numeric column as a numpy array (no list of Python objects for 10 M rows), read as :func:`read_columns`."""
    return read_columns(ds, [name]).column(0).to_numpy()


def unique_values(ds: Dataset, name: str) -> list:
    """The distinct values of a column (None included when some rows lack it)."""
    return pc.unique(read_columns(ds, [name]).column(0)).to_pylist()


def label_codes(column: pa.Array | pa.ChunkedArray, labels: Sequence[str]) -> np.ndarray:
    """Per row of a :func:`read_columns` column, the index of its value in ``labels``; -1 where absent or unknown."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    value_set = pa.array(list(labels), pa.string())
    if pa.types.is_dictionary(column.type):
        lookup = pc.index_in(column.dictionary, value_set=value_set)
        codes = pc.take(lookup, column.indices)
    else:
        codes = pc.index_in(column, value_set=value_set)
    return pc.fill_null(codes, -1).to_numpy(zero_copy_only=False).astype(np.int64)


def lengths_array(ds: Dataset) -> np.ndarray:
    """The ``length`` column as int32: all that the length-bucketed sampler needs of a tokenized table."""
    return column_numpy(ds, "length").astype(np.int32, copy=False)


def _file_schema(path: str) -> pa.Schema:
    with pa.OSFile(path) as f:
        return pa.ipc.read_schema(pa.ipc.read_message(f))


def run_piece(piece: Piece, out_path: str, columns: Sequence[str], fn: BatchFn, fn_kwargs: Mapping[str, Any],
              features: Features, batch_rows: int, on_rows: Callable[[int], Any] | None = None) -> int:
    """Apply ``fn`` to a piece, ``batch_rows`` rows at a time, and write the output to ``out_path``; return its rows."""
    schemas: dict[str, pa.Schema] = {}
    row = piece.first_row
    with ArrowWriter(features=features, path=out_path, writer_batch_size=WRITER_BATCH_ROWS) as writer:
        for path, offset in piece.batches:
            with pa.OSFile(path) as f:
                schema = schemas.setdefault(path, pa.ipc.read_schema(pa.ipc.read_message(f)))
                f.seek(offset)
                batch = pa.ipc.read_record_batch(pa.ipc.read_message(f), schema).select(list(columns))
            for start in range(0, batch.num_rows, batch_rows):
                part = batch.slice(start, batch_rows)
                indices = list(range(row, row + part.num_rows))
                writer.write_batch(fn(part.to_pydict(), indices, **fn_kwargs))
                row += part.num_rows
                if on_rows is not None:
                    on_rows(part.num_rows)
        writer.finalize()
    return row - piece.first_row


def _run_piece_args(args: tuple) -> int:
    return run_piece(*args)


def map_batches(ds: Dataset, fn: BatchFn, *, key: str, features: Features, num_proc: int = 1,
                batch_rows: int = WRITER_BATCH_ROWS, fn_kwargs: Mapping[str, Any] | None = None, desc: str = "") -> Dataset:
    """``fn(batch, indices, **fn_kwargs)`` over ``ds`` in row order: a new table with ``features``, named by ``key``.

    ``fn`` gets a column dict of up to ``batch_rows`` rows and their row numbers and returns any number of rows; an
    in-memory ``ds`` goes through ``Dataset.map``.
    """
    fn_kwargs = dict(fn_kwargs or {})
    pieces = plan_pieces(ds, num_proc)
    if pieces is None:
        return ds.map(fn, batched=True, with_indices=True, batch_size=batch_rows, features=features,
                      num_proc=num_proc if num_proc > 1 else None, remove_columns=ds.column_names,
                      new_fingerprint=key, fn_kwargs=fn_kwargs, desc=desc)
    folder = data_cache_dir() / key
    if not folder.exists():
        _write_shards(folder, pieces, ds.column_names, fn, fn_kwargs, features, batch_rows, num_proc, desc)
    return load_shards(folder)


def load_shards(folder: Path) -> Dataset:
    """The shards of a :func:`map_batches` folder, memory-mapped and concatenated in order."""
    # Only the numbered shards: datasets may write its own ``cache-*.arrow`` beside them, which are not this table's.
    shards = [Dataset.from_file(str(path)) for path in sorted(folder.glob("[0-9][0-9][0-9][0-9][0-9].arrow"))]
    return shards[0] if len(shards) == 1 else concatenate_datasets(shards)


def _write_shards(folder: Path, pieces: list[Piece], columns: list[str], fn: BatchFn, fn_kwargs: dict,
                  features: Features, batch_rows: int, num_proc: int, desc: str) -> None:
    """Write every piece's shard into a temporary folder, then rename it to ``folder`` (first one wins)."""
    tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    jobs = [(piece, str(tmp / f"{i:05d}.arrow"), columns, fn, fn_kwargs, features, batch_rows)
            for i, piece in enumerate(pieces)]
    with hf_tqdm(total=sum(p.rows for p in pieces), unit=" rows", desc=desc or "map") as bar:
        if num_proc > 1 and len(jobs) > 1:
            with multiprocess.Pool(min(num_proc, len(jobs))) as pool:
                for rows in pool.imap(_run_piece_args, jobs):
                    bar.update(rows)
        else:
            for job in jobs:
                run_piece(*job, on_rows=bar.update)
    try:
        os.replace(tmp, folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
