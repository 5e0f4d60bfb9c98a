"""map_batches: the same rows as Dataset.map, in order, for any num_proc; read without the source's memory map."""

from __future__ import annotations

from pathlib import Path

import pytest
from datasets import Dataset, Features, Value

from ecomkit.data import stream
from ecomkit.data.stream import (batch_offsets, column_numpy, label_codes, lengths_array, map_batches, plan_pieces,
                                 read_columns, unique_values)

OUT = Features({"row": Value("int64"), "text": Value("string")})


def _expand(batch: dict, indices: list[int], copies: int = 1) -> dict:
    """Row i becomes ``i % 3 * copies`` rows (none for every third row): a filter and an expansion at once."""
    rows, texts = [], []
    for text, index in zip(batch["text"], indices):
        for _ in range(index % 3 * copies):
            rows.append(index)
            texts.append(text.upper())
    return {"row": rows, "text": texts}


def _fail(batch: dict, indices: list[int]) -> dict:
    raise AssertionError("a cached result was computed again")


@pytest.fixture()
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ECOMKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "datasets"


def _file_table(tmp_path: Path, n: int, text_chars: int = 8, batch: int = 700) -> Dataset:
    feats = Features({"text": Value("string"), "other": Value("int64")})
    ds = stream.cached_table(f"src{n}-{text_chars}-{batch}", lambda: [
        {"text": [f"r{i:06d}" + "x" * text_chars for i in range(s, min(s + batch, n))],
         "other": list(range(s, min(s + batch, n)))} for s in range(0, n, batch)], feats)
    return ds


def _expected(ds: Dataset) -> list[tuple[int, str]]:
    return [(i, t.upper()) for i, t in enumerate(ds["text"]) for _ in range(i % 3)]


@pytest.mark.parametrize("num_proc", [1, 2])
def test_rows_and_order_match_a_plain_loop(tmp_path, cache, num_proc):
    ds = _file_table(tmp_path, 5_000)
    assert plan_pieces(ds, num_proc) is not None          # file-backed: streamed, not Dataset.map
    out = map_batches(ds.remove_columns("other"), _expand, key=f"t{num_proc}", features=OUT, num_proc=num_proc,
                      batch_rows=300)
    assert list(zip(out["row"], out["text"])) == _expected(ds)
    assert len(list((cache / f"t{num_proc}").glob("*.arrow"))) == len(plan_pieces(ds, num_proc))


def test_in_memory_table_goes_through_dataset_map(cache):
    ds = Dataset.from_dict({"text": [f"r{i}" for i in range(50)]})
    assert plan_pieces(ds, 1) is None
    out = map_batches(ds, _expand, key="mem", features=OUT, fn_kwargs={"copies": 2})
    assert list(out["row"]) == [i for i in range(50) for _ in range(i % 3 * 2)]
    assert not (cache / "mem").exists()


def test_indices_mapping_is_not_streamed(tmp_path, cache):
    ds = _file_table(tmp_path, 100).select([5, 1, 7])
    assert plan_pieces(ds, 1) is None
    assert list(map_batches(ds, _expand, key="sel", features=OUT)["row"]) == [1, 2, 2]   # positions in the selection


def test_a_finished_result_is_mapped_not_recomputed(tmp_path, cache):
    ds = _file_table(tmp_path, 900)
    first = map_batches(ds, _expand, key="again", features=OUT)
    second = map_batches(ds, _fail, key="again", features=OUT)
    assert list(second["row"]) == list(first["row"])
    assert not list(cache.glob("*.tmp"))


def test_empty_output_still_has_its_columns(tmp_path, cache):
    ds = _file_table(tmp_path, 2)           # rows 0 and 1: row 0 gives no output, row 1 one
    out = map_batches(ds, _expand, key="tiny", features=OUT)
    assert out.column_names == ["row", "text"] and list(out["row"]) == [1]
    empty = map_batches(ds.select_columns(["text"]), lambda b, i: {"row": [], "text": []}, key="none", features=OUT)
    assert len(empty) == 0 and empty.column_names == ["row", "text"]


def test_batch_offsets_count_every_row(tmp_path, cache):
    ds = _file_table(tmp_path, 2_345)
    offsets = batch_offsets(ds.cache_files[0]["filename"])
    assert sum(rows for _, rows in offsets) == 2_345
    assert [o for o, _ in offsets] == sorted({o for o, _ in offsets})


def test_pieces_are_capped_so_progress_moves(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(stream, "MAX_PIECE_ROWS", 1_000)
    pieces = plan_pieces(_file_table(tmp_path, 5_000), num_proc=1)
    assert [p.rows for p in pieces] == [1_400, 1_400, 1_400, 800]     # 700-row batches, closed at >= 1,000
    assert [p.first_row for p in pieces] == [sum(q.rows for q in pieces[:i]) for i in range(len(pieces))]


def test_columns_read_without_the_map_equal_the_table(tmp_path, cache):
    ds = _file_table(tmp_path, 2_100)
    labels = [f"r{i:06d}" + "x" * 8 for i in (5, 2_000)]
    for view in (ds, ds.select([2_000, 3, 5]), Dataset.from_dict(ds[:40])):       # files, indices, in memory
        table = read_columns(view, ["text", "other"])
        assert table.column("text").to_pylist() == list(view["text"])
        assert column_numpy(view, "other").tolist() == list(view["other"])
        assert sorted(unique_values(view, "text")) == sorted(set(view["text"]))
        codes = label_codes(table.column("text"), labels)
        assert codes.tolist() == [labels.index(t) if t in labels else -1 for t in view["text"]]
    nulls = Dataset.from_dict({"sentiment": ["positive", None, "negative"], "length": [3, 1, 2]})
    assert unique_values(nulls, "sentiment") == ["positive", None, "negative"]
    assert label_codes(read_columns(nulls, ["sentiment"]).column(0), ["negative", "positive"]).tolist() == [1, -1, 0]
    assert lengths_array(nulls).dtype.name == "int32" and lengths_array(nulls).tolist() == [3, 1, 2]


def test_tables_are_written_in_large_record_batches(tmp_path, cache):
    """10,000-row batches: opening a table maps each batch's header page, and 64 KiB around it."""
    ds = stream.cached_table("big-batches", lambda: [{"text": ["a"] * 25_000, "other": list(range(25_000))}],
                            Features({"text": Value("string"), "other": Value("int64")}))
    assert [rows for _, rows in batch_offsets(ds.cache_files[0]["filename"])] == [10_000, 10_000, 5_000]


def _rss_file_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile line")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_streaming_does_not_keep_the_source_pages_resident(tmp_path, cache):
    """The reason map_batches exists: Dataset.map over a file-backed table leaves its pages in the RSS.

    A ~120 MB table is mapped both ways; each pass is measured as the growth of the file-backed resident set.
    """
    ds = _file_table(tmp_path, 120_000, text_chars=1_000)
    size = Path(ds.cache_files[0]["filename"]).stat().st_size
    count = Features({"n": Value("int64")})

    def lengths(batch, indices):
        return {"n": [len(t) for t in batch["text"]]}

    before = _rss_file_bytes()
    map_batches(ds, lengths, key="streamed", features=count)
    streamed = _rss_file_bytes() - before
    before = _rss_file_bytes()
    assert column_numpy(ds, "other").sum() == sum(range(120_000))
    column = _rss_file_bytes() - before                  # before Dataset.map below maps every page
    before = _rss_file_bytes()
    ds.map(lengths, batched=True, with_indices=True, remove_columns=ds.column_names, features=count,
           cache_file_name=str(tmp_path / "plain.arrow"))
    mapped = _rss_file_bytes() - before
    assert size > 100e6
    assert streamed < 0.1 * size, f"streaming kept {streamed / 1e6:.0f} MB of a {size / 1e6:.0f} MB source resident"
    assert column < 0.1 * size, f"reading one column kept {column / 1e6:.0f} MB of the source resident"
    assert mapped > 0.5 * size, f"Dataset.map kept only {mapped / 1e6:.0f} MB: the comparison no longer shows why"
