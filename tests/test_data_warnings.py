"""What data cannot give is said, not left to a zero: labels asked for that never occur, rows with no label."""

from __future__ import annotations

import csv

import pytest

from ecomkit.data import build_datasets, load_records, write_jsonl
from ecomkit.errors import ConfigError
from ecomkit.models.tokenizer import get_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return get_tokenizer("synthetic", tmp_path_factory.mktemp("tok"), n_rows=1500)


def test_rows_without_a_label_are_listed_by_line(tmp_path):
    path = tmp_path / "reviews.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["review", "sentiment"])
        for i in range(30):   # file lines 2..31; rows 5, 11, 17, 23, 29 and 30 have no label
            writer.writerow([f"评论 {i} 很好", "" if i in (3, 9, 15, 21, 27, 28) else "positive"])
    report = load_records(path, task="nlu").report
    assert (report.kept, report.unlabeled) == (30, 6)
    assert report.unlabeled_first == ["line 5", "line 11", "line 17", "line 23", "line 29"]
    assert load_records(path, task="lm").report.unlabeled == 0      # task lm learns from the text alone


def test_build_warns_about_unlabeled_rows_and_labels_that_never_occur(tmp_path, tok):
    rows = [{"text": f"华为手机 {i}", "spans": [{"type": "品牌", "term": "华为", "start": 0, "end": 2}]}
            for i in range(40)]
    rows[7] = {"text": "一行没有标注的文本"}                          # line 8: a text and nothing to learn
    path = write_jsonl(rows, tmp_path / "ner.jsonl")
    *_, report = build_datasets(str(path), seed=0, task="nlu", tokenizer=tok, max_length=64,
                                labels=["品牌", "颜色"])
    warnings = report.warnings()
    assert report.labels_not_in_data == ("颜色",)
    assert any("颜色 never occur" in w and "品牌" in w and "--labels" in w for w in warnings), warnings
    assert any("1 of 40 valid rows have no label" in w and "line 8" in w for w in warnings), warnings
    assert report.facts()["unlabeled_first"] == ["line 8"] and report.facts()["labels_not_in_data"] == ["颜色"]
    *_, clean = build_datasets(str(path), seed=0, task="nlu", tokenizer=tok, max_length=64, labels=["品牌"])
    assert not [w for w in clean.warnings() if "never occur" in w]


def test_a_misspelled_extraction_label_is_an_error_with_the_closest_one(tmp_path, tok):
    """Issue 56 item 5: ``--labels 品碑`` (one character off the data's 品牌) trained a label no span carries."""
    rows = [{"text": f"华为手机 黑色 {i}", "spans": [{"type": "品牌", "term": "华为", "start": 0, "end": 2},
                                                 {"type": "颜色", "term": "黑色", "start": 5, "end": 7}]} for i in range(40)]
    path = write_jsonl(rows, tmp_path / "ner.jsonl")
    with pytest.raises(ConfigError, match=r"--labels: '品碑' never occurs in the spans of the data\. Did you mean "
                                          r"'品牌'\?.*span labels: 品牌, 颜色"):
        build_datasets(str(path), seed=0, task="nlu", tokenizer=tok, max_length=64, labels=["品碑", "颜色"])
    *_, report = build_datasets(str(path), seed=0, task="nlu", tokenizer=tok, max_length=64, labels=["品牌", "尺码"])
    assert report.labels_not_in_data == ("尺码",)   # far from every label of the data: still a warning
