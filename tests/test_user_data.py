"""Bring your own data: the three shapes (reviews, instructions, plain text), label maps, no silent caps, bad rows.

Small generated files in each shape go through the real loaders and
``build_datasets``; the 2-process run at the end trains on a review file whose
labels sit inside an object (``{"labels": {"coarse": [category], "polarity":
0/1}}``), reached by the column map's paths alone and a label map, and is
evaluated on a dev file of its own, every row of which the final evaluation
reads.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import fastlaunch
import numpy as np
import pytest

from ecomkit.config import parse_config
from ecomkit.config.validate_options import LABEL_MAP_TARGETS
from ecomkit.data import (build_datasets, lengths_array, load_records, stratified_split, write_csv, write_jsonl)
from ecomkit.data.catalog import CATEGORIES, review_rows
from ecomkit.data.tokenize import IGNORE_INDEX
from ecomkit.data.validate import MAP_KEYS
from ecomkit.errors import ConfigError, DataError
from ecomkit.models.tokenizer import get_tokenizer

REVIEW_COLUMNS = {"cat": "category", "label": "sentiment"}
SENTIMENT_01 = {"sentiment": {"0": "negative", "1": "positive"}}


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("local", Path(os.environ["ECOMKIT_CACHE"]))


@pytest.fixture(scope="module")
def reviews():
    return review_rows(400, seed=1)


def build(path, tok, task="nlu", **kwargs):
    return build_datasets(str(path), seed=0, task=task, tokenizer=tok, max_length=96, **kwargs)


# ----------------------------------------------------------------- shape 1: reviews (category, 0/1 label, text)

def test_review_csv_uses_every_row_with_only_a_column_and_a_label_map(tmp_path, tok, reviews):
    path = write_csv(reviews, tmp_path / "reviews.csv", fields=["cat", "label", "review"])
    train, evald, eval_records, report = build(path, tok, column_map=REVIEW_COLUMNS, label_map=SENTIMENT_01)
    assert report.n_train_records + report.n_eval_records == len(reviews) == 400
    assert report.examples_per_kind == {"category": 400, "sentiment": 400}
    assert report.labels == {"category": CATEGORIES[:4], "sentiment": ("positive", "negative")}  # from the data
    assert len(train) + len(evald) == 800 and "polarity" in train.column_names
    assert "Using all 400 valid records" in report.summary() and "category 400, sentiment 400" in report.summary()
    # stratified: each (category, sentiment) pair keeps its share of the 20 eval records, within one record
    pairs = Counter((r["cat"], r["label"]) for r in reviews)
    held = Counter((r["category"], r["sentiment"]) for r in eval_records)
    for (cat, label), n in pairs.items():
        assert abs(held[(cat, "positive" if label else "negative")] - n * 20 / 400) <= 1
    assert lengths_array(train).dtype == np.int32 and lengths_array(train).tolist() == train["length"]


def test_integer_labels_without_a_label_map_are_labels_from_the_data(tmp_path, tok, reviews):
    path = write_jsonl(reviews, tmp_path / "reviews.jsonl")
    *_, report = build(path, tok, column_map=REVIEW_COLUMNS)
    assert report.labels["sentiment"] == ("0", "1")


def test_baselines_learn_the_training_majority_when_the_dev_file_has_another(tmp_path, tok):
    """Issue #43 item 1: a train file whose majority is 服饰 and a dev file whose majority is 手机.

    The majority baseline must answer the training majority (服饰); on main it took the dev labels it was
    scored on, so it answered 手机 and was a baseline no model could know.
    """
    from ecomkit.config import TrainConfig
    from ecomkit.train.gen_eval import evaluator_for_run

    train = [{"title": f"商品{i}", "category": "服饰" if i % 4 else "手机"} for i in range(40)]    # 30 服饰 / 10 手机
    dev = [{"title": f"新品{i}", "category": "手机" if i % 4 else "服饰"} for i in range(12)]      # 9 手机 / 3 服饰
    train_path, dev_path = write_jsonl(train, tmp_path / "train.jsonl"), write_jsonl(dev, tmp_path / "dev.jsonl")
    *_, report = build(train_path, tok, eval_data=str(dev_path), prompt_format="seqgpt")
    assert report.train_label_counts == {"category": Counter({"服饰": 30, "手机": 10})}
    assert report.facts()["train_label_counts"] == {"category": {"服饰": 30, "手机": 10}}
    evaluator = evaluator_for_run(TrainConfig(task="nlu"), report)
    assert evaluator.majorities == {report.labels["category"]: "服饰"}
    rows = [r for r in evaluator.examples if r.kind == "classify"]
    assert len(rows) == 12


def test_unmapped_label_is_a_counted_reason_and_strict_names_file_line_field(tmp_path, reviews):
    rows = [dict(r) for r in reviews[:40]]
    rows[6]["label"] = 2
    path = write_csv(rows, tmp_path / "r.csv", fields=["cat", "label", "review"])
    report = load_records(path, column_map=REVIEW_COLUMNS, task="nlu", label_map=SENTIMENT_01).report
    assert report.counts == {"unmapped_label": 1}
    assert "'2' is not in label_map['sentiment']" in report.summary()
    with pytest.raises(DataError, match=r"r\.csv, line 8, field 'sentiment' \(your column 'label'\).*unmapped_label"):
        load_records(path, column_map=REVIEW_COLUMNS, task="nlu", label_map=SENTIMENT_01, strict=True)


# ----------------------------------------------------------------- shape 2: instruction JSONL

def test_instruction_jsonl_both_layouts_loss_on_the_response_only(tmp_path, tok):
    rows = [{"instruction": "判断评论的情感", "input": f"第{i}次买,很好用", "output": "正面"} for i in range(10)]
    rows += [{"question": f"这款手机多少钱?{i}", "answer": "2999元"} for i in range(10)]
    path = write_jsonl(rows, tmp_path / "sft.jsonl")
    for task in ("nlu", "lm"):
        train, evald, _, report = build(path, tok, task=task, column_map={"question": "prompt", "answer": "response"})
        assert report.examples_per_kind == {"instruction": 20}
        for row in list(train) + list(evald):
            answer = [t for t in row["labels"] if t != IGNORE_INDEX]
            assert row["labels"][0] == IGNORE_INDEX and answer[-1] == tok.eos_token_id
            assert tok.decode(answer[:-1]) in ("正面", "2999元")
    first = load_records(path, column_map={"question": "prompt", "answer": "response"}).records[0]
    assert first["prompt"] == "判断评论的情感\n第0次买,很好用\n答:" and first["response"] == "正面"


# ----------------------------------------------------------------- shape 3: plain text for lm

def test_text_only_file_trains_lm_on_every_token(tmp_path, tok):
    path = write_jsonl([{"content": f"第{i}条商品描述:纯棉T恤,透气舒适。"} for i in range(30)], tmp_path / "t.jsonl")
    train, evald, _, report = build(path, tok, task="lm", column_map={"content": "text"})
    assert report.examples_per_kind == {"lm": 30} and len(train) + len(evald) == 30
    assert all(row["labels"] == row["input_ids"] for row in train)
    assert tok.decode(train[0]["input_ids"][:-1]).startswith("第")


# ----------------------------------------------------------------- bad rows, robustly read

def test_bom_multiline_quoted_field_100k_cell_and_empty_text(tmp_path):
    path = tmp_path / "bad.csv"
    long_cell = "好" * 100_000
    text = ("\ufeffcat,label,review\n手机,1,\"两行\n的评论\"\n手机,0,   \n服饰,1,\"" + long_cell + "\"\n服饰,0,不错\n")
    path.write_text(text, encoding="utf-8")
    result = load_records(path, column_map=REVIEW_COLUMNS, task="nlu", label_map=SENTIMENT_01)
    assert result.report.counts == {"empty_field": 1, "over_long_text": 1}
    assert result.report.first_issue["empty_field"].location == "line 4"    # the quoted field spans lines 2-3
    assert result.report.first_issue["over_long_text"].location == "line 5"
    assert [r["review"] for r in result.records] == ["两行\n的评论", "不错"]
    roomy = load_records(path, column_map=REVIEW_COLUMNS, task="nlu", label_map=SENTIMENT_01, max_chars=200_000)
    assert len(roomy.records[1]["review"]) == 100_000


def test_undecodable_bytes_are_one_row_not_the_file(tmp_path):
    path = tmp_path / "gbk.csv"
    path.write_bytes("cat,label,review\n".encode() + "手机,1,很好\n".encode() + "手机,0,".encode()
                     + "差评".encode("gbk") + b"\n" + "服饰,1,好\n".encode())
    report = load_records(path, column_map=REVIEW_COLUMNS, label_map=SENTIMENT_01).report
    assert report.counts == {"undecodable_bytes": 1} and report.first_issue["undecodable_bytes"].location == "line 3"


def test_more_than_max_bad_fraction_stops_with_the_per_reason_report(tmp_path, tok, reviews):
    rows = [dict(r) for r in reviews[:100]]
    for r in rows[:6]:
        r["label"] = 7                                       # 6 % unmapped
    path = write_csv(rows, tmp_path / "r.csv", fields=["cat", "label", "review"])
    with pytest.raises(DataError, match=r"unmapped_label 6 .*6\.0% of the rows, above max_bad_fraction=0\.05"):
        build(path, tok, column_map=REVIEW_COLUMNS, label_map=SENTIMENT_01)
    *_, report = build(path, tok, column_map=REVIEW_COLUMNS, label_map=SENTIMENT_01, max_bad_fraction=0.1)
    assert report.validation.kept == 94 and report.n_train_records + report.n_eval_records == 94


def test_user_files_are_never_capped_silently(tmp_path, tok, reviews):
    path = write_csv(reviews, tmp_path / "r.csv", fields=["cat", "label", "review"])
    with pytest.raises(ConfigError, match="--n-rows 4000 sets the size of the synthetic catalog.*--max-rows"):
        build(path, tok, n_rows=4000, column_map=REVIEW_COLUMNS, label_map=SENTIMENT_01)
    *_, report = build(path, tok, max_rows=100, column_map=REVIEW_COLUMNS, label_map=SENTIMENT_01)
    assert report.n_train_records + report.n_eval_records == 100
    assert "Capped by max_rows=100: using 100 of 400 valid records" in report.summary()


# ----------------------------------------------------------------- the split, and config

def test_stratified_split_keeps_every_strata_share_within_one_row():
    rng = np.random.default_rng(0)
    strata = rng.choice(7, size=10_001, p=[0.5, 0.2, 0.1, 0.1, 0.05, 0.04, 0.01])
    order = rng.permutation(len(strata))
    eval_idx, train_idx = stratified_split(order, strata[order], 0.05)
    assert len(eval_idx) == 501 and sorted(np.concatenate([eval_idx, train_idx]).tolist()) == list(range(10_001))
    for s in range(7):
        assert abs((strata[eval_idx] == s).sum() - 0.05 * (strata == s).sum()) <= 1


def test_label_map_from_flag_and_yaml_and_its_checks(tmp_path):
    cfg, _ = parse_config(["--label-map", json.dumps(SENTIMENT_01), "--max-rows", "500"])
    assert cfg.label_map == SENTIMENT_01 and cfg.max_rows == 500 and cfg.max_bad_fraction == 0.05
    (tmp_path / "c.yaml").write_text("label_map:\n  sentiment:\n    '0': negative\n    '1': positive\n")
    cfg, _ = parse_config(["--config", str(tmp_path / "c.yaml")])
    assert cfg.label_map == SENTIMENT_01
    for bad in ('{"rating": {"1": "bad"}}', '{"sentiment": {}}'):
        with pytest.raises((ConfigError, SystemExit)):
            parse_config(["--label-map", bad])
    with pytest.raises((ConfigError, SystemExit)):
        parse_config(["--max-bad-fraction", "1.5"])
    assert LABEL_MAP_TARGETS == MAP_KEYS


# ----------------------------------------------------------------- the acceptance run: 2 processes, learns both targets

# 2,000 review rows (4 categories, 0/1 labels), 150 steps of global batch 64 at lr 5e-3, seq_len 64, tiny
# model. Measured (100 held-out records, eval every 30 steps): category 0.25 → 1.00 by step 60 (majority 0.27),
# sentiment stays at its majority 0.70 until step 90 (0.74), then 0.97 at 120 and 0.99 at 150. At lr 1e-2
# sentiment had not left the majority by step 100, so 150 steps at 5e-3 leave room. ~80 s on 2 busy cores.
# These figures are for the ecomkit prompts, which this run keeps (--prompt-format ecomkit). In the default seqgpt
# format the label line sits between the text and the answer, and this 2-block ALiBi model learns more slowly:
# measured, both targets at their majority up to step 150, then category 0.51 / 0.62 and sentiment 0.97 / 1.00
# at steps 250 / 300. Candidate scoring in the seqgpt format is covered by tests/test_learning.py (400 steps), and
# this file's shape trains in it in tests/test_extraction_train.py.
ROWS, STEPS = 2000, 150
DEV_ROWS = 101  # odd: the two ranks' shares differ by one, and the final evaluation still reads every row
MARGIN = 0.10   # accuracy ≥ majority baseline + 10 points, category and sentiment
NESTED_COLUMNS = {"labels.coarse[0]": "category", "labels.polarity": "sentiment"}


def nested_reviews(n: int, seed: int) -> list[dict]:
    """Review rows with their labels inside an object: a category list and a 0/1 polarity."""
    return [{"review": r["review"], "labels": {"coarse": [r["cat"]], "fine": [], "polarity": r["label"]}}
            for r in review_rows(n, seed=seed)]


@pytest.mark.dist
@pytest.mark.slow
def test_two_process_run_on_nested_labels_evaluates_every_dev_row_and_beats_the_majority_baseline(tmp_path):
    """Issue #43 acceptance: trained and evaluated on a nested-label file through the column map alone, and the
    final evaluation of a run with --eval-data covers every row of the file (on main the paths were ignored
    without a word and "no nlu example could be built"; the final evaluation read --eval-nlu-samples records)."""
    data = write_jsonl(nested_reviews(ROWS, seed=0), tmp_path / "reviews.jsonl")
    dev = write_jsonl(nested_reviews(DEV_ROWS, seed=5), tmp_path / "dev.jsonl")
    out = tmp_path / "run"
    args = ["--data", str(data), "--eval-data", str(dev), "--task", "nlu", "--column-map", json.dumps(NESTED_COLUMNS),
            "--label-map", json.dumps(SENTIMENT_01), "--prompt-format", "ecomkit", "--seq-len", "64",
            "--micro-batch-size", "32", "--lr", "5e-3", "--max-steps", str(STEPS), "--eval-interval", "0",
            "--eval-batches", "1", "--eval-nlu-samples", "16", "--gen-eval-samples", "8", "--gen-max-new-tokens", "8",
            "--no-save-model", "--no-progress", "--output-dir", str(out)]
    proc = fastlaunch.run(Path(__file__).resolve().parents[1] / "scripts" / "02_data_parallel.py", args, 2,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["train_records"] == summary["data"]["rows_read"] == ROWS
    assert summary["data"]["eval_records"] == summary["data"]["eval_rows_read"] == DEV_ROWS
    assert summary["data"]["examples_per_kind"] == {"category": ROWS + DEV_ROWS, "sentiment": ROWS + DEV_ROWS}
    # every dev row, in every figure: loss, candidate scoring of each target, and generation
    assert summary["eval_loss_examples"] == 2 * DEV_ROWS and f"({2 * DEV_ROWS} held-out examples)" in proc.stdout
    assert summary["scored_category"] == summary["scored_sentiment"] == summary["nlu_scored"] == DEV_ROWS
    assert summary["gen_decoded"] == summary["gen_held_out"] == summary["gen_classify_n"] == 2 * DEV_ROWS
    assert len((out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()) == 2 * DEV_ROWS
    train_counts = summary["data"]["train_label_counts"]
    for target in ("category", "sentiment"):
        acc, base = summary[f"acc_{target}"], summary[f"majority_{target}"]
        majority = max(train_counts[target], key=train_counts[target].get)   # the baseline learns from training
        assert summary[f"majority_label_{target}"] == majority
        assert f"margin {100 * (acc - base):+.1f} points" in proc.stdout
        assert acc >= base + MARGIN, (target, acc, base)
